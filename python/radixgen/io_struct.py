"""Typed messages between RadixGen's processes (pickled over ZMQ between our own processes only).

Down the path (`*Req`): TokenizerManager -> Scheduler. Back (`*Out`): Scheduler -> Detokenizer ->
TokenizerManager, and control replies Scheduler -> TokenizerManager.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Generic, TypeAlias, TypeVar, cast

from radixgen.errors import InvalidRequestError
from radixgen.finish_reason import FinishReason
from radixgen.internal_state import InternalState
from radixgen.program_trace import ProgramTraceTag
from radixgen.sampling_params import SamplingParams

# (logprob, token_id) pairs; the API process adds token text when asked.
LogprobList = list[tuple[float | None, int]]
# one position's top alternatives, best first (every logprob known)
TopLogprobList = list[tuple[float, int]]


@dataclass
class TokenizedGenerateReq:
    """One sequence to generate (n > 1 arrives as n of these sharing a prompt)."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    arrival_time: float = 0.0
    # resolved by the TokenizerManager: the user's priority, --default-priority-value or 0; 0
    # while --enable-priority-scheduling is off (the scheduler reads it through its direction)
    priority: int = 0
    # a Batch API line: queued below every interactive request, preempted first
    background: bool = False
    # the LoRA adapter (its name) the sequence runs under; None: the base model
    lora_path: str | None = None
    # keep the prompt's blocks pinned in HiCache's host tier (ignored without the tiers)
    pin_prefix: bool = False


@dataclass
class TokenizedEmbeddingReq:
    """One sequence to embed (prefill-only: the scheduler keeps no KV and sends one vector)."""

    rid: str
    input_ids: list[int]
    dimensions: int | None = None  # Matryoshka width asked for; None: the model's full width
    arrival_time: float = 0.0
    # a cross-encoder's (query, document) pair: the segment of each token (None: all 0)
    token_type_ids: list[int] | None = None


@dataclass
class BatchEmbeddingOut:
    """Scheduler -> TokenizerManager (straight, no detokenizer): the requests a step answered,
    one record each: its vector, or the error that stopped it."""

    outputs: list[EmbeddingVector | EmbeddingFailure]

    @property
    def rids(self) -> list[str]:
        return [o.rid for o in self.outputs]


@dataclass(slots=True)
class EmbeddingVector:
    """A request's embedding (float32 values as Python floats; a cross-encoder's: its one
    relevance score)."""

    rid: str
    prompt_tokens: int
    values: list[float]
    cached_tokens: int = 0  # of the prompt, reused from a decoder embedder's radix tree


@dataclass(slots=True)
class EmbeddingFailure:
    """A request the embedding scheduler refused (status 400) or failed (500)."""

    rid: str
    prompt_tokens: int
    message: str
    status: int


@dataclass
class AbortReq:
    rid: str = ""
    abort_all: bool = False
    message: str = "aborted by the client"


@dataclass
class ControlReq:
    """A control request; its reply carries the same `request_id` (replies are matched by it)."""

    request_id: str = ""


@dataclass
class ControlOut:
    request_id: str = field(default="", kw_only=True)


@dataclass
class FlushCacheReq(ControlReq):
    # HiCache: empty only the KV pool's radix tree, keeping the host and file tiers
    keep_lower_tiers: bool = False


@dataclass
class FlushCacheOut(ControlOut):
    success: bool
    message: str = ""


@dataclass
class LoadLoraAdapterReq(ControlReq):
    """Load a PEFT LoRA adapter from a folder under a name (SGLang's /load_lora_adapter)."""

    lora_name: str = ""
    lora_path: str = ""


@dataclass
class UnloadLoraAdapterReq(ControlReq):
    """Unload an adapter by name; requests of it already in the scheduler finish first."""

    lora_name: str = ""


@dataclass
class LoraAdapterOut(ControlOut):
    """The scheduler's answer to a load or unload: done, or why not (a refusal's reason)."""

    success: bool
    message: str = ""


@dataclass
class GetInternalStateReq(ControlReq):
    pass


@dataclass
class GetInternalStateOut(ControlOut):
    # a `SchedulerState` (an embedding server's: `EmbeddingSchedulerState`); with --dp-size > 1
    # the TokenizerManager merges the replicas' (`summed_internal_state`)
    state: InternalState


@dataclass
class DashboardSnapshotReq(ControlReq):
    """The dashboard asks the scheduler for its picture: counters, a capped radix tree, recent
    steps and request timelines (answered between steps, only when asked)."""

    max_nodes: int = 200


@dataclass(frozen=True, slots=True)
class RadixNodeView:
    """One radix node as the dashboard shows it. `parent` is -1 for the root's children."""

    id: int
    parent: int
    tokens: int  # tokens this node's edge holds
    prefix_tokens: int  # tokens from the root to the end of this node
    lock_ref: int
    hits: int
    idle_s: float  # seconds since the last match or insert touched it
    children: int
    hidden_children: int  # children left out by the cap
    preview_ids: list[int]  # the key's first tokens (the API process decodes them)
    preview_truncated: bool


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One forward step's batch composition and the scheduler's counters after it."""

    time: float  # wall clock
    decode_rows: int
    prefill_rows: int
    prefill_tokens: int
    grammar_rows: int
    jump_forward_tokens: int  # so far (cumulative)
    running: int
    waiting: int
    kv_used: int  # KV slots in use
    generated_tokens: int  # so far (cumulative)


@dataclass(frozen=True, slots=True)
class RequestTimeline:
    """One request's timeline (wall-clock seconds) and counters; token ids undecoded."""

    rid: str
    state: str  # running, waiting or finished
    arrival: float | None
    admitted: float | None
    first_token: float | None
    finished: float | None
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    completion_tokens: int
    retractions: int
    jump_forward_tokens: int
    constrained: bool
    finish_reason: str | None
    finish_message: str | None
    prompt_head_ids: list[int]
    prompt_tail_ids: list[int]
    prompt_gap: int  # prompt tokens between the head and the tail
    output_ids: list[int]
    output_truncated: bool


@dataclass(slots=True)
class DashboardSnapshot:
    """A scheduler's picture for the dashboard (built between steps, only when asked)."""

    time: float
    build_seconds: float  # scheduler time this snapshot took
    state: InternalState
    retracted_waiting: int  # waiting requests that were retracted at least once
    radix_enabled: bool
    tree_nodes: list[RadixNodeView]
    tree_truncated: bool  # nodes were left out by the cap
    steps: list[StepRecord]  # the most recent last
    requests: list[RequestTimeline]  # live ones, then the recently finished (newest first)
    dp_size: int = 1  # replicas (with --dp-size > 1 the rest is replica 0's)


@dataclass
class DashboardSnapshotOut(ControlOut):
    snapshot: DashboardSnapshot


@dataclass
class SchedulerReadyOut:
    """Sent once by a scheduler after the model is loaded (through the launcher's pipe)."""

    max_total_num_tokens: int
    max_req_input_len: int
    context_length: int
    vocab_size: int
    num_threads: int
    startup_seconds: float
    dtype: str
    dp_rank: int = 0  # which data-parallel replica (0 with --dp-size 1)
    # what runs, not the flags given: `--quantization` as resolved (gguf, unquant, w8a16, ...)
    # and the native CPU kernels' instruction-set variant (None: the torch path, or CUDA)
    quantization: str = "unquant"
    kernel_isa: str | None = None
    # the quantized GEMM's activations: "int8" (RADIXGEN_CPU_ACT_QUANT) or "off" (float32);
    # None without native kernels
    kernel_act_quant: str | None = None
    # steps of this many rows run the model's linear layers from bf16 copies on oneDNN
    # (RADIXGEN_AMX_WIDE_ROWS); None: never
    kernel_wide_rows: int | None = None
    # an embedding model's vector width (`--is-embedding`, or an encoder's config); None: the
    # server generates text
    embedding_dim: int | None = None
    cross_encoder: bool = False  # the embedding model scores (query, document) pairs: /v1/rerank
    # the scheduler cuts a step of batch lines short when an interactive request's rid comes
    # to its doorbell (runtime/scheduler/step_interrupt.py)
    interruptible: bool = False


@dataclass(slots=True)
class RequestMeta:
    """Per-request counters that travel with every output."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    jump_forward_tokens: int = 0
    retractions: int = 0
    # of cached_tokens, those copied back from the host tier (--enable-hierarchical-cache)
    host_cached_tokens: int = 0
    storage_cached_tokens: int = 0  # likewise, from the file tier
    # wall-clock seconds from the API's submit to the first output token (scheduler's view), so
    # time to first token is known for requests that are not streamed too
    first_token_delay: float | None = None
    # wall-clock seconds from the API's submit to the first admission (time spent queued)
    queue_delay: float | None = None
    grammar_backend: str | None = None  # constrained requests: the backend that served it
    # json_schema requests: the exact schema rewrites that served it ("not:required", "if", ...)
    schema_rewrites: tuple[str, ...] = ()
    # json_schema requests: the keywords the checked layer validated ("uniqueItems", ...) and
    # the rollbacks it made (runtime/constrained/value_checker.py)
    schema_checks: tuple[str, ...] = ()
    schema_check_rollbacks: int = 0

    def __reduce__(self) -> tuple[type[RequestMeta], tuple[object, ...]]:
        return (RequestMeta, _request_meta_values(self))


@dataclass(slots=True)
class TokenIDDelta:
    """One request's part of a `BatchTokenIDOut`: its new token ids since the last send."""

    rid: str
    rollback: int  # previously sent tokens to drop before appending new_token_ids
    new_token_ids: list[int]
    finished_reason: FinishReason | None
    meta: RequestMeta
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    no_stop_trim: bool
    # stop strings and stop_regex patterns go with a request's first message only (empty
    # afterwards; a failure's message, built without them, has none)
    stop_strings: list[str] = field(default_factory=list)
    stop_regexes: list[str] = field(default_factory=list)
    # logprobs (delta for output; input ones are sent once, with the first output)
    output_token_logprobs: LogprobList | None = None
    output_top_logprobs: list[TopLogprobList | None] | None = None
    input_token_logprobs: LogprobList | None = None
    input_top_logprobs: list[TopLogprobList | None] | None = None

    def __reduce__(self) -> tuple[type[TokenIDDelta], tuple[object, ...]]:
        # pickled as its field values in order (rebuilt by __init__), not as a state dict
        return (TokenIDDelta, _token_id_delta_values(self))


@dataclass
class BatchTokenIDOut:
    """Scheduler -> Detokenizer: one record per request with something to send this step."""

    deltas: list[TokenIDDelta]

    def __reduce__(self) -> tuple[Callable[..., BatchTokenIDOut], tuple[object, ...]]:
        # NOTE: pickled as columns (one tuple per field): smaller and faster than a record each
        return (_token_ids_from_columns, (_columns(map(_token_id_delta_values, self.deltas)),))


@dataclass(slots=True)
class TextDelta:
    """One request's part of a `BatchStrOut`: its new text (and ids) since the last send."""

    rid: str
    text: str
    new_token_ids: list[int]
    finished_reason: FinishReason | None
    meta: RequestMeta
    rollback: int = 0  # previously sent token ids to drop before appending new_token_ids
    output_token_logprobs: LogprobList | None = None
    output_top_logprobs: list[TopLogprobList | None] | None = None
    input_token_logprobs: LogprobList | None = None
    input_top_logprobs: list[TopLogprobList | None] | None = None

    def __reduce__(self) -> tuple[type[TextDelta], tuple[object, ...]]:
        return (TextDelta, _text_delta_values(self))


def apply_delta(ids: list[int], delta: TokenIDDelta | TextDelta) -> list[int]:
    """`ids` (a request's tokens sent so far) updated by its next delta: the rolled-back tokens
    dropped, then the new ones appended."""
    if delta.rollback:
        del ids[len(ids) - delta.rollback :]
    ids.extend(delta.new_token_ids)
    return ids


@dataclass
class BatchStrOut:
    """Detokenizer -> TokenizerManager: one record per request of the token batch it decoded."""

    deltas: list[TextDelta]

    def __reduce__(self) -> tuple[Callable[..., BatchStrOut], tuple[object, ...]]:
        return (_texts_from_columns, (_columns(map(_text_delta_values, self.deltas)),))


# a record's field values in __init__'s order (one C call; the pickled form of the records)
_request_meta_values: Callable[[RequestMeta], tuple[object, ...]] = attrgetter(
    *(f.name for f in fields(RequestMeta))
)
_token_id_delta_values: Callable[[TokenIDDelta], tuple[object, ...]] = attrgetter(
    *(f.name for f in fields(TokenIDDelta))
)
_text_delta_values: Callable[[TextDelta], tuple[object, ...]] = attrgetter(
    *(f.name for f in fields(TextDelta))
)


def _columns(rows: Iterable[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """Records' field values as columns, one tuple per field ([] without records)."""
    return list(zip(*rows, strict=True))


def _token_ids_from_columns(columns: list[tuple[object, ...]]) -> BatchTokenIDOut:
    make: Callable[..., TokenIDDelta] = TokenIDDelta
    return BatchTokenIDOut(list(map(make, *columns)) if columns else [])


def _texts_from_columns(columns: list[tuple[object, ...]]) -> BatchStrOut:
    make: Callable[..., TextDelta] = TextDelta
    return BatchStrOut(list(map(make, *columns)) if columns else [])


# --- one message union per socket, and the receivers' dispatch --------------------------------

# control requests, each answered by one control reply carrying its `request_id`
ControlRequest: TypeAlias = (
    FlushCacheReq
    | LoadLoraAdapterReq
    | UnloadLoraAdapterReq
    | GetInternalStateReq
    | DashboardSnapshotReq
)
ControlReply: TypeAlias = (
    FlushCacheOut | LoraAdapterOut | GetInternalStateOut | DashboardSnapshotOut
)
# the `scheduler` socket (TokenizerManager -> each replica's scheduler); a generating scheduler
# takes no TokenizedEmbeddingReq, an embedding one neither TokenizedGenerateReq nor LoRA requests
SchedulerInbound: TypeAlias = (
    TokenizedGenerateReq | TokenizedEmbeddingReq | AbortReq | ControlRequest
)
# the `detokenizer` socket (every scheduler -> the detokenizer)
DetokenizerInbound: TypeAlias = BatchTokenIDOut
# the `tokenizer` socket (the detokenizer and every scheduler -> the TokenizerManager)
TokenizerInbound: TypeAlias = BatchStrOut | BatchEmbeddingOut | ControlReply

_M = TypeVar("_M")
_P = TypeVar("_P")
_R = TypeVar("_R")


class UnknownMessageError(TypeError):
    """A receiver got a message of a type it has no handler for (a sender's bug)."""


class MessageDispatch(Generic[_R]):
    """A receiver's handlers by exact message type: built once, one dict lookup per message."""

    def __init__(self, receiver: str) -> None:
        self.receiver = receiver
        self._handlers: dict[type[object], Callable[[object], _R]] = {}

    def on(self, cls: type[_M], handler: Callable[[_M], _R]) -> MessageDispatch[_R]:
        assert cls not in self._handlers, f"{cls.__name__} has a handler already"
        # NOTE: sound: a handler is only called with a message whose type is exactly `cls`
        self._handlers[cls] = cast("Callable[[object], _R]", handler)
        return self

    @property
    def types(self) -> frozenset[type[object]]:
        """The message types handled."""
        return frozenset(self._handlers)

    def __call__(self, msg: object) -> _R:
        handler = self._handlers.get(type(msg))
        if handler is None:
            known = ", ".join(sorted(t.__name__ for t in self._handlers))
            raise UnknownMessageError(
                f"the {self.receiver} cannot handle a {type(msg).__name__} message "
                f"(it handles {known})"
            )
        return handler(msg)


_PER_ITEM_FIELDS = (
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "rid",
    "lora_path",
)


@dataclass
class GenerateReqInput:
    """A user's /generate call (or Engine.generate): one prompt or a batch, SGLang's field names."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    # one object, or one per prompt of a batch: checked by SamplingParams.from_dict
    sampling_params: Mapping[str, object] | list[Mapping[str, object]] | None = None
    return_logprob: bool | list[bool] = False
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None
    stream: bool = False
    # the data-parallel replica to run on (set by an external router), None: the policy decides
    data_parallel_rank: int | None = None
    # a traced DSL program's call (radixgen/program_trace.py): recorded for the dashboard
    program_trace: ProgramTraceTag | None = None
    # SGLang's request priority (--enable-priority-scheduling); one value for the whole batch
    priority: int | None = None
    # set by the Batch API's runner, never by a client: the request runs below interactive ones
    background: bool = False
    # the LoRA adapter by name (SGLang's field), one or one per prompt; None: the base model
    lora_path: str | list[str | None] | None = None
    # radixgen's prefix hint: once computed, the prompt's KV stays in HiCache's host tier (and is
    # written to its file tier), out of reach of the tier's LRU; ignored without the tiers
    pin_prefix: bool = False

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        if not self.input_ids:
            return False
        return isinstance(self.input_ids[0], list)

    def check_per_item_lengths(self) -> None:
        """Per-item lists must have one entry per prompt (a list on a single prompt is refused)."""
        n = self.batch_size() if self.is_batch else -1
        for name in _PER_ITEM_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, list):
                continue
            if n < 0:
                raise InvalidRequestError(f"{name} is a list but the prompt is not a batch", name)
            if len(value) != n:
                raise InvalidRequestError(
                    f"{name} has {len(value)} entries for a batch of {n} prompts", name
                )

    def batch_size(self) -> int:
        if not self.is_batch:
            return 1
        if self.text is not None:
            return len(self.text)
        assert self.input_ids is not None  # a batch without text is a batch of ids
        return len(self.input_ids)

    def item(self, i: int) -> GenerateReqInput:
        """The i-th prompt of a batch as a single request (per-item lists are indexed)."""

        def pick(value: _P | list[_P] | None, default: _P | None = None) -> _P | None:
            if isinstance(value, list):
                return value[i] if i < len(value) else default
            return value

        return GenerateReqInput(
            text=self.text[i] if isinstance(self.text, list) else None,
            # a batch's ids are a list of lists (only batches are split into items)
            input_ids=cast("list[int]", self.input_ids[i]) if self.input_ids is not None else None,
            sampling_params=pick(self.sampling_params),
            return_logprob=bool(pick(self.return_logprob, False)),
            logprob_start_len=pick(self.logprob_start_len),
            top_logprobs_num=pick(self.top_logprobs_num),
            return_text_in_logprobs=self.return_text_in_logprobs,
            rid=self.rid[i]
            if isinstance(self.rid, list)
            else (f"{self.rid}_{i}" if self.rid else None),
            stream=self.stream,
            data_parallel_rank=self.data_parallel_rank,
            program_trace=self.program_trace,
            priority=self.priority,
            background=self.background,
            lora_path=(self.lora_path[i] if i < len(self.lora_path) else None)
            if isinstance(self.lora_path, list)
            else self.lora_path,
            pin_prefix=self.pin_prefix,
        )
