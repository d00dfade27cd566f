"""SGLang launch flags that have no field of their own here, each with what it does here and why.

The one table behind `radixgen serve` / `python -m radixgen.launch_server` accepting an SGLang
launch command unchanged, the startup log line of every flag given without effect, and the flag
table in python/radixgen/sglang_flags.md. Flags with a field in `ServerArgs` (`--tp-size`, `--page-size`,
...) are implemented and live there; `ALIASES` and `VALUE_COMPAT` map SGLang's other spellings
of them. Names and arities follow SGLang 0.5.23's `ServerArgs` (plus a few flags of older
releases still found in launch scripts); a test checks the table against SGLang's own parser.

Spec syntax, one flag per word: `name` a switch, `name/no` a switch with a `--no-` form,
`name=` one value, `name=*` a list of values, `name=?` an optional value; `name=a,b` one value
where `a` or `b` asks for what runs here anyway (accepted without effect even when the topic is
refused; `name=""` is the empty value); `|` separates aliases.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class FlagStatus(str, Enum):
    IMPLEMENTED = "implemented"
    NO_EFFECT = "accepted, no effect"
    REFUSED = "refused"


@dataclass(frozen=True)
class FlagTopic:
    """Flags that share one status and one reason."""

    status: FlagStatus
    reason: str
    specs: str


@dataclass(frozen=True)
class ValueCompat:
    """SGLang's values for a flag we implement: aliases of ours, and the rest refused."""

    sglang_values: str = ""  # space-separated, like the specs
    aliases: tuple[tuple[str, str], ...] = ()  # (SGLang's spelling, ours)
    refusal: str = ""  # why a value SGLang knows and we do not is refused

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(self.sglang_values.split())


N, R = FlagStatus.NO_EFFECT, FlagStatus.REFUSED

# SGLang flags that are fields of `ServerArgs` here (same name, same meaning).
IMPLEMENTED: tuple[str, ...] = (
    "model-path", "tokenizer-path", "dtype", "context-length", "served-model-name",
    "chat-template", "device", "random-seed", "max-total-tokens", "mem-fraction-static",
    "page-size", "disable-radix-cache", "max-running-requests", "max-queued-requests",
    "chunked-prefill-size", "max-prefill-tokens", "schedule-policy", "schedule-conservativeness",
    "stream-interval", "grammar-backend", "constrained-json-whitespace-pattern", "tp-size",
    "dp-size", "host", "port", "api-key", "log-level", "log-requests", "log-requests-level",
    "enable-metrics", "enable-cache-report", "enable-lora", "lora-paths", "max-loras-per-batch",
    "max-lora-rank", "lora-target-modules",
    "tool-call-parser", "reasoning-parser", "load-balance-method", "attention-backend",
    "disable-overlap-schedule", "speculative-algorithm", "speculative-num-draft-tokens",
    "speculative-ngram-max-bfs-breadth", "speculative-ngram-min-match-window-size",
    "speculative-ngram-max-match-window-size", "speculative-ngram-capacity",
    "disable-cuda-graph", "cuda-graph-max-bs", "cuda-graph-bs", "kv-cache-dtype",
    "quantization",
    "dist-timeout", "dist-init-addr", "nnodes", "node-rank", "enable-dp-attention",
    "is-embedding",
    "enable-priority-scheduling", "schedule-low-priority-values-first", "default-priority-value",
    "abort-on-priority-when-disabled", "disable-priority-preemption",
    "priority-scheduling-preemption-threshold",
    "enable-hierarchical-cache", "hicache-ratio", "hicache-size", "hicache-storage-backend",
    "hicache-write-policy",
)  # fmt: skip

# SGLang flags implemented here without a `ServerArgs` field (read before the parse), with help.
IMPLEMENTED_ON_THE_COMMAND_LINE: dict[str, str] = {
    "config": "A YAML file of launch flags (`model-path: ...`), read first: flags given on the "
    "command line win.",
}

# Other spellings SGLang accepts for flags we implement.
ALIASES: dict[str, tuple[str, ...]] = {
    "model-path": ("model",),
    "tp-size": ("tensor-parallel-size",),
    "dp-size": ("data-parallel-size",),
    "dist-init-addr": ("nccl-init-addr",),
    "data-dir": ("file-storage-path",),
    "enable-hierarchical-cache": ("enable-hicache",),
}

VALUE_COMPAT: dict[str, ValueCompat] = {
    "kv-cache-dtype": ValueCompat(
        "fp8_e5m2 mxfp8 bfloat16 nvfp4 fp4_mx_block16",
        aliases=(("bfloat16", "bf16"),),
        refusal="this KV cache format is not implemented here",
    ),
    "dtype": ValueCompat(aliases=(("half", "float16"), ("float", "float32"))),
    "device": ValueCompat(
        "xpu hpu npu mps musa",
        refusal="this build runs on CPU (and CUDA once the GPU path lands)",
    ),
    "attention-backend": ValueCompat(
        (
            "torch_native fa3 fa4 flex_attention flashmla cutlass_mla trtllm_mla trtllm_mha "
            "dual_chunk_flash_attn aiter wave intel_amx intel_xpu ascend nsa hybrid_linear_attn"
        ),
        aliases=(("torch_native", "torch"),),
        refusal="this attention kernel family is not implemented here",
    ),
    "load-balance-method": ValueCompat(
        "total_requests total_tokens follow_bootstrap_room minimum_tokens",
        aliases=(("total_requests", "shortest_queue"),),
        refusal="only request counts and prefix affinity are balanced here",
    ),
    "quantization": ValueCompat(
        "awq fp8 gptq marlin gptq_marlin awq_marlin bitsandbytes modelopt w8a8_int8 w8a8_fp8 "
        "moe_wna16 qoq w4afp8 mxfp4",
        refusal="only GGUF blocks (gguf) and int8 weight-only (w8a16, int8) run quantized here",
    ),
    "schedule-policy": ValueCompat(
        "random lof priority routing-key hrrn shortest-prefill-first",
        refusal="this queue order is not implemented",
    ),
    "tool-call-parser": ValueCompat(
        (
            "auto apertus2509 beam cohere_command4 deepseekv3 deepseekv31 deepseekv32 deepseekv4 "
            "deepseekv41 dots glm glm45 glm47 gpt-oss k2_horizon kimi_k2 kimi_k3 lfm2 ling3 llama3 "
            "mimo minicpm5 mistral muse poolside_v1 pythonic qwen qwen25 qwen3_coder spark25 step3 "
            "step3p5 minimax-m2 minimax-m3 nanbeige trinity interns1 hermes hunyuan gigachat3 "
            "gigachat35 gemma4 inkling iquest_q1 response_template"
        ),
        refusal="this tool-call format is not parsed here",
    ),
    "reasoning-parser": ValueCompat(
        (
            "auto apertus2509 beam deepseek-r1 deepseek-v3 deepseek-v4 deepseek-v41 dots glm45 "
            "ling3 hunyuan gpt-oss k2_horizon kimi kimi_k2 kimi_k3 mimo muse poolside_v1 qwen3 "
            "qwen3-thinking minimax minimax-append-think minimax-m3 nanbeige step3 step3p5 mistral "
            "nemotron_3 granite_thinking_parser interns1 gemma4 inkling iquest_q1 cohere_command4 "
            "gigachat35 response_template"
        ),
        refusal="this reasoning format is not parsed here",
    ),
}

TOPICS: tuple[FlagTopic, ...] = (
    # --- model and weights ------------------------------------------------------------------
    FlagTopic(
        N,
        "model code is never executed: the architectures served are implemented here",
        "trust-remote-code",
    ),
    FlagTopic(
        N,
        "weights are read once from the local folder or .gguf file (never downloaded); this "
        "loader has no such option",
        "revision= download-dir= model-loader-extra-config= model-impl= model-config-parser= "
        "startup-weight-load-mode= weight-loader-disable-mmap weight-loader-prefetch-checkpoints "
        "weight-loader-prefetch-num-threads= weight-loader-drop-cache-after-load "
        "engine-info-bootstrap-port= delete-ckpt-after-loading "
        "checkpoint-engine-wait-weights-before-ready weight-cache-mode= weight-cache-socket= "
        "weight-cache-timeout=",
    ),
    FlagTopic(
        R,
        "this loader reads Hugging Face safetensors folders and GGUF files only",
        "load-format=auto,safetensors,gguf",
    ),
    FlagTopic(
        R,
        "weights load only from a local folder or .gguf file: remote loaders, custom loaders, "
        "checksums and encrypted checkpoints are not implemented",
        "custom-weight-loader=* remote-instance-weight-loader-seed-instance-ip= "
        "remote-instance-weight-loader-seed-instance-service-port= "
        "remote-instance-weight-loader-send-weights-group-ports= "
        "remote-instance-weight-loader-backend= "
        "remote-instance-weight-loader-start-seed-via-transfer-engine modelexpress-config= "
        "model-checksum=? decrypted-config-file= decrypted-draft-config-file=",
    ),
    FlagTopic(
        R,
        "overriding the model's config is not implemented",
        "json-model-override-args={}",
    ),
    FlagTopic(
        R,
        "only --quantization (gguf, w8a16, int8) is implemented: no calibration files, ModelOpt "
        "or quantize-and-serve",
        "quantization-param-path= modelopt-quant= "
        "modelopt-checkpoint-restore-path= modelopt-checkpoint-save-path= modelopt-export-path= "
        "quantize-and-serve rl-quant-profile=",
    ),
    FlagTopic(
        R,
        "quantized KV (--kv-cache-dtype) is read by the attention kernels directly: there is no "
        "separate dequantized prefill copy",
        "prefill-kv-cache-dequant-dtype=auto",
    ),
    FlagTopic(
        R,
        "only text generation and embeddings are served: no reward or diffusion models",
        "dllm-algorithm= dllm-algorithm-config=",
    ),
    FlagTopic(
        R,
        "no image, video or audio inputs here: text only",
        "enable-multimodal enable-llama4-multimodal",
    ),
    FlagTopic(
        N,
        "a multimodal setting, and no image, video or audio inputs are taken here",
        "mm-attention-backend= enable-broadcast-mm-inputs-process enable-prefix-mm-cache "
        "mm-enable-dp-encoder/no mm-process-config= mm-processor-worker-num= mm-io-worker-num= "
        "allowed-media-domains=* media-url-max-file-size-mb= mm-preprocess-cache-size-mb= "
        "trust-mm-content-hashes limit-mm-data-per-request= enable-mm-global-cache "
        "image-processor-backend= mm-global-cache-backend= disable-fast-image-processor "
        "mm-feature-transport=",
    ),
    FlagTopic(
        R,
        "an adapter for the MoE experts' own LoRA layout: adapters here target q/k/v/o and "
        "gate/up/down of dense layers",
        "uno-lora-path= experts-shared-outer-loras/no lora-use-virtual-experts",
    ),
    FlagTopic(
        N,
        "a LoRA tuning knob: adapters load synchronously into --max-loras-per-batch slots "
        "(LRU), applied by torch GEMMs per adapter group",
        "enable-lora-overlap-loading max-loaded-loras= lora-eviction-policy= lora-backend= "
        "max-lora-chunk-size= lora-strict-loading/no lora-drain-wait-threshold=",
    ),
    # --- device and kernels -----------------------------------------------------------------
    FlagTopic(
        N,
        "a GPU kernel choice: the CPU path has one set of native kernels",
        "decode-attention-backend= prefill-attention-backend= "
        "sampling-backend= fp8-gemm-backend= fp4-gemm-backend= bf16-gemm-backend= "
        "enable-lean-attention disable-flashinfer-autotune flashinfer-autotune-skip-ops=* "
        "triton-attention-reduce-in-fp32 triton-attention-num-kv-splits= "
        "triton-attention-split-tile-size= enable-fused-qk-norm-rope/no enable-tf32-matmul/no "
        "enable-fp32-lm-head enable-precise-embedding-interpolation enable-scattered-sconv "
        "enable-mis enable-amd-monokernel monokernel-backend= enable-nvidia-megakernel "
        "enable-dsa-fused-indexer/no",
    ),
    FlagTopic(
        N,
        "a CUDA-graph setting without a counterpart here: decode steps are captured at the sizes "
        "--cuda-graph-max-bs / --cuda-graph-bs give (never prefill), on CUDA only",
        "cuda-graph-config= "
        "cuda-graph-backend-decode= cuda-graph-backend-prefill= cuda-graph-max-bs-decode= "
        "cuda-graph-max-bs-prefill= cuda-graph-bs-decode=* cuda-graph-bs-prefill=* "
        "cuda-graph-prefill-max-context|context-bucket= cuda-graph-max-seq-len-prefill= "
        "disable-prefill-cuda-graph disable-decode-cuda-graph disable-cuda-graph-padding "
        "enable-profile-cuda-graph enable-cudagraph-gc debug-cuda-graph",
    ),
    FlagTopic(
        N,
        "torch.compile is not used: the CPU path runs native kernels",
        "enable-torch-compile enable-torch-compile-debug-mode torch-compile-max-bs=",
    ),
    FlagTopic(
        N,
        "a GPU placement or process-supervision setting with no counterpart on this CPU path",
        "base-gpu-id= gpu-id-step= mlx-enable-sampling watchdog-timeout= soft-watchdog-timeout= "
        "sleep-on-idle numa-node=* gc-threshold=*",
    ),
    FlagTopic(
        N,
        "weights and KV stay in memory: offloading and memory-saver modes are not implemented",
        "cpu-offload-gb= offload-group-size= offload-num-in-group= offload-prefetch-step= "
        "offload-mode= enable-memory-saver enable-weights-cpu-backup "
        "enable-draft-weights-cpu-backup ple-offload-embedding/no ple-offload-backend= "
        "ple-offload-dir= sampling-mask-max-tokens=",
    ),
    FlagTopic(
        N,
        "applies to a model family not served here (MLA, sparse, hybrid or linear attention); "
        "the loader refuses such models",
        "c128-page-size= swa-full-tokens-ratio= disable-hybrid-swa-memory dsa-prefill-backend= "
        "dsv4-prefill-backend= dsa-decode-backend= dsa-paged-mqa-logits-backend= "
        "dsa-topk-backend= dsa-triton-union= enable-dsa-cache-layer-split dsv4-attn-backend= "
        "qsa-indexer-dtype= enable-deepseek-v4-fp4-indexer flashinfer-mla-disable-ragged "
        "disable-mla enable-flashinfer-mla enable-flashmla enable-double-sparsity "
        "enable-linker-mla-dedup hybrid-kvcache-ratio= mamba-backend= max-mamba-cache-size= "
        "mamba-ssm-dtype= "
        "mamba-max-states-per-path= enable-mamba-cache-stochastic-rounding "
        "mamba-cache-philox-rounds= mamba-full-memory-ratio= mamba-radix-cache-strategy= "
        "mamba-track-interval= enable-int8-mamba-checkpoint int8-mamba-ckpt-size= "
        "linear-attn-backend= linear-attn-decode-backend= linear-attn-prefill-backend= "
        "linear-attn-verify-backend= enable-linear-replayssm linear-replayssm-cache-len= "
        "enable-linear-replayssm-spec dllm-fdfo/no swa-prefix-tails= "
        "enable-encoder-swa-bounded-replay enable-decoder-swa-bounded-replay/no",
    ),
    FlagTopic(
        N,
        "a mixture-of-experts setting, and the models served here have no experts",
        "moe-runner-backend= moe-a2a-backend= moe-dense-tp-size= enable-fused-moe-sum-all-reduce "
        "enable-w4a4-mxfp4-megamoe enable-megamoe-for-layernorm-sp deepep-mode= deepep-v2-mode= "
        "deepep-config= deepep-dispatcher-output-dtype= fuseep-mode= "
        "flashinfer-mxfp4-moe-precision= flashinfer-a2a-dispatch-type= "
        "disable-flashinfer-cutlass-moe-fp4-allgather ep-num-redundant-experts= "
        "ep-dispatch-algorithm= init-expert-location= enable-eplb eplb-algorithm= "
        "eplb-rebalance-num-iterations= eplb-rebalance-layers-per-chunk= "
        "eplb-min-rebalancing-utilization-threshold= expert-distribution-recorder-mode= "
        "expert-distribution-recorder-buffer-size= expert-balancedness-report-mode= "
        "elastic-ep-backend= enable-elastic-expert-backup elastic-ep-join-mode= "
        "elastic-ep-join-rank-offset= elastic-ep-initial-size= elastic-ep-scale-timeout= "
        "max-ep-size= mooncake-ib-device= enable-waterfill enable-shared-experts-attn-tp "
        "shared-experts-tp-size= disable-shared-experts-fusion enforce-shared-experts-fusion "
        "kt-weight-path= kt-method= kt-cpuinfer= kt-threadpool-count= kt-num-gpu-experts= "
        "kt-max-deferred-experts-per-token= enable-paged-experts paged-experts-num-resident= "
        "enable-ep-moe enable-deepep-moe enable-flashinfer-moe",
    ),
    # --- parallelism ------------------------------------------------------------------------
    FlagTopic(
        R,
        "pipeline, expert, context and attention-data parallelism are not available: each "
        "--dp-size replica runs the whole model, split only by --tp-size",
        "pp-size|pipeline-parallel-size=1 ep-size|expert-parallel-size|ep=1 "
        "dcp-size|decode-context-parallel-size=1 attn-dp-size|attention-data-parallel-size=1 "
        "attn-cp-size|attention-context-parallel-size=1 moe-dp-size|moe-data-parallel-size=1 "
        "dwdp-size=1",
    ),
    FlagTopic(
        N,
        "only matters with several ranks or nodes, and each model replica runs in one process here",
        "nccl-port= gated-launch-port= "
        "pp-max-micro-batch-size= pp-async-batch-depth= dcp-comm-backend= "
        "dcp-replicate-q-proj/no enable-prefill-cp cp-strategy= enable-cp-decode-attn-tp "
        "enable-kv-cache-sharding enable-dp-attention-local-control-broadcast enable-dp-lm-head "
        "enable-tp-lm-head-all-to-all/no enable-attn-tp-input-scattered enable-dense-mlp-attn-tp "
        "enable-layernorm-sp disable-attn-tp-gather enable-p2p-check enable-nccl-nvls "
        "enable-symm-mem enable-torch-symm-mem disable-custom-all-reduce enable-mscclpp "
        "pre-warm-nccl boundary-reduction= enable-quant-communications "
        "enforce-disable-flashinfer-allreduce-fusion flashinfer-allreduce-fusion-backend= "
        "enable-flashinfer-allreduce-fusion enable-aiter-allreduce-fusion "
        "disable-aiter-allreduce-fusion-in-prefill disable-aiter-allreduce-fusion-in-decode",
    ),
    FlagTopic(
        R,
        "prefill-decode and encoder disaggregation are not available: this server runs every "
        "stage of a request itself",
        "disaggregation-mode=null decoupled-spec-role=null encoder-only language-only "
        "language-model-only enable-pd-role-switch",
    ),
    FlagTopic(
        N,
        "a disaggregation setting, and disaggregation is not available here",
        "disaggregation-transfer-backend= disaggregation-bootstrap-port= "
        "disaggregation-ib-device= disaggregation-decode-enable-radix-cache "
        "disaggregation-decode-enable-offload-kvcache disaggregation-decode-retraction-backup= "
        "disaggregation-decode-extra-slots= disaggregation-decode-polling-interval= "
        "disaggregation-enable-kv-checksum disaggregation-decode-host-receive-threshold= "
        "disaggregation-decode-allocation-policy= num-reserved-decode-tokens= "
        "optimistic-prefill-attempts= decoupled-spec-bind-endpoint= "
        "decoupled-spec-connect-endpoints= decoupled-spec-rank= encoder-transfer-backend= "
        "encoder-urls=* encoder-bootstrap-port= encoder-register-urls=* "
        "enable-adaptive-dispatch-to-encoder enable-pdmux pdmux-config-path= sm-group-num=",
    ),
    # --- scheduling and cache ---------------------------------------------------------------
    FlagTopic(
        N,
        "only n-gram speculative decoding is available (--speculative-algorithm NGRAM, with its "
        "draft trees and window sizes): no draft model, and SGLang's other tree or adaptive "
        "settings do not apply; tokens are verified exactly",
        "speculative-draft-model-path|speculative-draft-model= "
        "speculative-draft-model-revision= speculative-draft-load-format= "
        "speculative-num-steps= speculative-eagle-topk= "
        "speculative-dflash-block-size= speculative-dspark-block-size= "
        "speculative-dspark-sps-table-path= speculative-dspark-confidence-sts-path= "
        "speculative-dspark-align-verify-tokens-to-graph-tier speculative-accept-threshold-single= "
        "speculative-accept-threshold-acc= speculative-use-rejection-sampling "
        "speculative-token-map= speculative-attention-mode= speculative-draft-attention-backend= "
        "speculative-dsa-topk-backend= speculative-draft-kv-cache-dtype= "
        "speculative-draft-window-size= speculative-moe-runner-backend= "
        "speculative-moe-a2a-backend= speculative-enable-w4a4-mxfp4-megamoe/no "
        "speculative-draft-model-quantization= enable-multi-layer-eagle speculative-adaptive "
        "speculative-adaptive-config= spec-trace-dir= speculative-ngram-min-bfs-breadth= "
        "speculative-ngram-match-type= "
        "speculative-ngram-max-trie-depth= "
        "speculative-ngram-external-corpus-path= speculative-ngram-external-sam-budget= "
        "speculative-ngram-external-corpus-max-tokens= speculative-domino-candidate-pool-size= "
        "speculative-use-block-verification speculative-draft-sink-size=",
    ),
    FlagTopic(
        N,
        "no two-batch overlap: one batch runs per step",
        "enable-two-batch-overlap enable-single-batch-overlap tbo-token-distribution-threshold=",
    ),
    FlagTopic(
        N,
        "prefill chunks always run in the same step as the decodes here",
        "enable-mixed-chunk",
    ),
    FlagTopic(
        N,
        "a scheduling heuristic this scheduler does not have: it admits by --schedule-policy, "
        "the KV budget and --chunked-prefill-size, and retracts the newest request first",
        "prefill-decode-interval= prefill-decode-interval-min-bs= enable-dynamic-chunking "
        "prefill-max-requests= retraction-policy= prefill-only-disable-kv-cache "
        "disable-chunked-prefix-cache num-continuous-decode-steps= scheduler-recv-interval= "
        "enable-prefill-delayer prefill-delayer-max-delay-passes= "
        "prefill-delayer-token-usage-low-watermark= prefill-delayer-forward-passes-buckets=* "
        "prefill-delayer-wait-seconds-buckets=* prefill-delayer-queue-min-ratio= "
        "prefill-delayer-max-delay-ms= min-free-slots-delay=",
    ),
    FlagTopic(
        N,
        "the radix cache always evicts the least recently used unlocked leaf",
        "radix-eviction-policy= radix-eviction-policy-config=",
    ),
    FlagTopic(
        N,
        "the hierarchical cache has a host tier and a file tier (--enable-hierarchical-cache, "
        "--hicache-ratio, --hicache-size, --hicache-storage-backend file, "
        "--hicache-write-policy): no other storage backends, host layouts, I/O backends, "
        "prefetch policies or external caches",
        "hicache-host-memory-mode= "
        "hicache-io-backend= hicache-mem-layout= "
        "hicache-storage-prefetch-policy= "
        "hicache-storage-backend-extra-config= hicache-storage-prefetch-retry-poll-interval= "
        "hicache-storage-prefetch-retry-max-attempts= hicache-host-memory-fraction= "
        "enable-hisparse hisparse-config|hierarchical-sparse-attention-extra-config= "
        "enable-lmcache lmcache-config-file= enable-flexkv flexkv-config-file= "
        "enable-unified-cache-external-linker unified-cache-external-linker-backend= "
        "unified-cache-external-linker-config= enable-session-radix-cache radix-cache-backend= "
        "enable-page-major-kv-layout enable-unified-memory",
    ),
    FlagTopic(
        N,
        "compiled grammars are cached in memory (--grammar-cache-max-bytes), never on disk",
        "disable-outlines-disk-cache disable-disk-cache",
    ),
    # --- serving ----------------------------------------------------------------------------
    FlagTopic(
        N,
        "one tokenizer (the model's fast one) runs in the API process and one detokenizer "
        "process serves all requests",
        "tokenizer-mode= tokenizer-backend= tokenizer-worker-num= detokenizer-worker-num= "
        "enable-dynamic-batch-tokenizer dynamic-batch-tokenizer-batch-size= "
        "dynamic-batch-tokenizer-batch-timeout= enable-tokenizer-batch-encode "
        "disable-tokenizer-batch-decode batch-notify-size=",
    ),
    FlagTopic(
        N,
        "a serving option this server does not have; requests are served as without it",
        "skip-server-warmup warmups= weight-version= strip-thinking-cache "
        "enable-strict-thinking sampling-defaults= asr-max-buffer-seconds= "
        "asr-max-concurrent-sessions= enable-streaming-session enable-response-store "
        "grpc-response-timeout-secs= enable-http-worker-reuseport "
        "http2-max-concurrent-streams= http2-initial-connection-window-size= "
        "constrained-json-max-whitespace-cnt=",
    ),
    FlagTopic(
        N,
        "constrained JSON is already compact here unless --constrained-json-whitespace-pattern "
        "allows whitespace",
        "constrained-json-disable-any-whitespace",
    ),
    FlagTopic(
        R,
        "it changes what the API returns or how it reads requests, and that option is not "
        "implemented here",
        "skip-tokenizer-init incremental-streaming-output stream-output "
        "stream-response-default-include-usage "
        "allow-auto-truncate return-input-ids return-output-ids preferred-sampling-params= "
        "default-chat-template-kwargs= completion-template= hf-chat-template-name= "
        "trust-request-chat-template tool-server= enable-custom-logit-processor "
        "enable-return-hidden-states return-hidden-states-mode= enable-return-routed-experts "
        "enable-return-indexer-topk enable-return-aux-hidden-states "
        "return-aux-hidden-state-layer-ids=* enable-watermark watermark-config= "
        "rl-on-policy-target=",
    ),
    FlagTopic(
        R,
        "batch-invariant (deterministic) kernels are not implemented: greedy outputs are not "
        "guaranteed identical across batch compositions",
        "enable-deterministic-inference",
    ),
    FlagTopic(
        R,
        "not served here: TLS and a separate admin key are not implemented (put a TLS proxy in "
        "front; --api-key guards every route)",
        "ssl-keyfile= ssl-certfile= ssl-ca-certs= ssl-keyfile-password= enable-ssl-refresh "
        "admin-api-key=",
    ),
    FlagTopic(
        R,
        "only HTTP/1.1 at the root path is served: no gRPC, HTTP/2, sidecars, path prefix or Ray",
        "smg-grpc-mode grpc-mode grpc-port= sidecar= sidecar-args= "
        'smg-http-sidecar-port|grpc-http-sidecar-port= enable-http2 fastapi-root-path="" use-ray',
    ),
    # --- observability ----------------------------------------------------------------------
    FlagTopic(
        N,
        "a logging, tracing or metrics option this server does not have (--log-level and "
        "--enable-metrics are implemented)",
        "log-level-http= log-requests-format= "
        "log-requests-target=* uvicorn-access-log-exclude-prefixes=* crash-dump-folder= "
        "show-time-cost enable-mfu-metrics enable-metrics-for-all-schedulers "
        "load-snapshot-publish-interval= tokenizer-metrics-custom-labels-header= "
        "tokenizer-metrics-allowed-custom-labels=* extra-metric-labels= "
        "bucket-time-to-first-token=* bucket-inter-token-latency=* bucket-e2e-request-latency=* "
        "prompt-tokens-buckets=* generation-tokens-buckets=* gc-warning-threshold-secs= "
        "decode-log-interval= enable-request-time-stats-logging kv-events-config= "
        "load-publish-endpoint= enable-forward-pass-metrics forward-pass-metrics-worker-id= "
        "forward-pass-metrics-ipc-name= enable-trace trace-modules= otlp-traces-endpoint= "
        "otlp-service-name= export-metrics-to-file export-metrics-to-file-dir= "
        "enable-layerwise-nvtx-marker kv-canary= kv-canary-sweep-interval= kv-canary-real-data= "
        "debug-tensor-dump-output-folder= debug-tensor-dump-layers=* "
        "debug-tensor-dump-input-file= forward-hooks= msprobe-dump-config= enable-nan-detection "
        "collect-tokens-histogram",
    ),
)
