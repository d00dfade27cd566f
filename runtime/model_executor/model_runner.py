"""Loads the model and its KV pools and runs one forward step (scheduler process)."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import torch

from radixgen.errors import InvalidRequestError
from radixgen.kernels.attention import create_attention_backend
from radixgen.kernels.cpu import (
    NativeKernels,
    has_fast_bf16,
    select_linear_gemm,
    select_native_kernels,
)
from radixgen.kernels.kv_quant import resolve_kv_cache_format
from radixgen.kernels.layer_ops import FusedLayerOps, select_gpu_fused_ops
from radixgen.runtime.distributed.parallel_linear import load_sharded_model
from radixgen.runtime.distributed.parallel_state import CollectiveError
from radixgen.runtime.mem_cache.memory_pool import (
    ReqToTokenPool,
    TokenToKVPool,
    kv_capacity_tokens,
)
from radixgen.runtime.model_executor.cuda_graph_runner import CudaGraphRunner, capture_batch_sizes
from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.model_executor.logits_output import LogitsOutput
from radixgen.runtime.model_loader.quant_loader import keeps_quantized, resolve_quantization
from radixgen.runtime.model_loader.weights import load_model
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.server_args import ServerArgs
from radixgen.utils import return_free_heap_to_os

if TYPE_CHECKING:
    from radixgen.runtime.distributed.dp_attention import DPAttentionSync
    from radixgen.runtime.distributed.parallel_linear import ParallelLMHead
    from radixgen.runtime.distributed.parallel_state import TensorParallelGroup
    from radixgen.runtime.distributed.tp_worker import StepChannel

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_bf16() -> bool:
    """AMX-BF16 or AVX512-BF16 makes bf16 matmuls fast on this CPU."""
    return has_fast_bf16()


def resolve_device(device: str) -> str:
    """`--device`: auto picks CUDA when a device is visible; cuda without one is refused."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise InvalidRequestError(
            f"--device cuda: no CUDA device is visible (torch {torch.__version__} is {build}); "
            "use --device cpu or auto",
            "device",
        )
    return device


# head dims flashinfer's attention modules are built for (its JIT compiles each on first use)
FLASHINFER_HEAD_DIMS = (64, 128, 256)


def flashinfer_serves(cfg: ModelArchConfig | None, dtype: torch.dtype | None) -> bool:
    """Whether the flashinfer backend can run this model: bf16 or fp16, a head dim it has, and
    no sliding-window layers (None: not known yet, assumed so)."""
    if dtype not in (None, torch.bfloat16, torch.float16):
        return False
    return cfg is None or (
        cfg.head_dim in FLASHINFER_HEAD_DIMS and all(w is None for w in cfg.layer_sliding_windows)
    )


def resolve_attention_backend(
    name: str,
    device: str,
    cfg: ModelArchConfig | None = None,
    dtype: torch.dtype | None = None,
) -> str:
    """The backend `--attention-backend` names on `device`, or a precise refusal.

    On CPU only torch runs natively; triton there needs Triton's interpreter (TRITON_INTERPRET=1,
    for the kernels' tests: it is thousands of times slower). `auto` on CUDA: flashinfer where it
    imports and serves the model (bf16 or fp16, a head dim it has, no sliding-window layers),
    else triton. Models that soft-cap attention logits (Gemma 2) run on torch or triton: `auto`
    picks triton on CUDA, and flashinfer is refused.
    """
    softcap = cfg is not None and cfg.attn_logit_softcapping is not None
    if softcap and name == "flashinfer":
        raise InvalidRequestError(
            "--attention-backend flashinfer has no attention logit soft-capping, which "
            f"{cfg.architecture if cfg else 'this model'} needs (use triton, torch or auto)",
            "attention_backend",
        )
    if name == "auto":
        if device == "cpu":
            return "torch"
        if softcap:
            return "triton"
        from importlib.util import find_spec

        serves = flashinfer_serves(cfg, dtype)
        return "flashinfer" if serves and find_spec("flashinfer") is not None else "triton"
    if (
        device == "cpu"
        and name == "triton"
        and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    ):
        raise InvalidRequestError(
            "--attention-backend triton needs a CUDA device (on CPU: torch; TRITON_INTERPRET=1 "
            "runs the Triton kernels interpreted, for tests only)",
            "attention_backend",
        )
    if device == "cpu" and name == "flashinfer":
        raise InvalidRequestError(
            "--attention-backend flashinfer needs a CUDA device (on CPU: torch)",
            "attention_backend",
        )
    return name


def resolve_dtype(dtype: str, device: str, kept_quantized: bool = False) -> torch.dtype:
    """`--dtype`: auto is bf16 on CUDA, on CPUs that multiply bf16 fast (AVX512-BF16, AMX),
    and wherever the weights are kept quantized (the native quantized GEMM takes bf16
    activations and accumulates in float32 on every ISA: AVX2 and AVX-512F too); else
    float32 (MKL's GEMM on dequantized weights)."""
    if dtype == "auto":
        if device.startswith("cuda") or cpu_has_bf16() or kept_quantized:
            return torch.bfloat16
        return torch.float32
    return _DTYPES[dtype]


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


class ModelRunner:
    """Owns the weights, the KV pools and the attention backend; `forward` returns fp32 logits."""

    def __init__(
        self,
        model_folder: str,
        args: ServerArgs,
        context_length: int,
        arch: ModelArchConfig | None = None,
        tp: TensorParallelGroup | None = None,
    ) -> None:
        """`arch`: the folder's config when the caller has read it already (else read here).
        `tp`: this process's tensor-parallel rank (None: the whole model in one process)."""
        t0 = time.perf_counter()
        self.args = args
        self.tp = tp
        # rank 0 of a TP group: sends each step's batch to the other ranks (set by the process)
        self.step_channel: StepChannel | None = None
        self.lm_head: ParallelLMHead | None = None
        self.dp_sync: DPAttentionSync | None = None  # DP attention: the group's step counts
        self.device = resolve_device(args.model.device)
        # NOTE: the one device decision: every tensor the step reads is placed on it here
        self.torch_device = torch.device(self.device)
        self.cfg = arch if arch is not None else ModelArchConfig.from_folder(model_folder)
        # NOTE: TP shards dense weights, so a GGUF runs dequantized there (ServerArgs refuses
        # any other --quantization with --tp-size > 1)
        kept = tp is None and keeps_quantized(
            args.model.quantization, model_folder, self.device, self.cfg.architecture
        )
        self.dtype = resolve_dtype(args.model.dtype, self.device, kept)
        self.attention_backend = resolve_attention_backend(
            args.model.attention_backend, self.device, self.cfg, self.dtype
        )
        self.context_length = context_length
        # NOTE: the one native-or-torch decision (device, dtype, environment, CPU features):
        # the model, its linear layers, the attention backend and the logits are handed it.
        self.native: NativeKernels | None = select_native_kernels(self.device, self.dtype)
        gemm = select_linear_gemm(self.native)
        self.linear_gemm = gemm  # the GEMM the linear layers were packed for (None: oneDNN)
        # GPU hook: the decoder's fused layer ops are the native CPU kernels, else on CUDA the
        # Triton ones (None: torch ops); attention and logits keep `self.native` (CPU only).
        self.layer_ops: FusedLayerOps | None = (
            self.native
            if self.native is not None
            else select_gpu_fused_ops(self.device, self.dtype)
        )
        # NOTE: parameters are allocated once in the target dtype and filled from the mmap'd
        # checkpoint (no random init, no fp32 copy, no meta-device paths importing sympy).
        self.quantization = "unquant" if tp is not None else resolve_quantization(
            args.model.quantization, model_folder, self.device, self.dtype, self.native,
            self.cfg.architecture,
        )  # fmt: skip
        if tp is None:
            self.model = load_model(
                model_folder, self.cfg, self.dtype, self.device, context_length + 1,
                self.layer_ops, gemm, self.quantization, self.native,
            )  # fmt: skip
            local_kv_heads = self.cfg.num_kv_heads
        else:
            sharded = load_sharded_model(
                model_folder, self.cfg, self.dtype, self.device, context_length + 1,
                self.layer_ops, gemm, tp, args.parallel.enable_dp_attention,
            )  # fmt: skip
            self.model, local_kv_heads = sharded.model, sharded.kv_heads
            self.lm_head, self.dp_sync = sharded.lm_head, sharded.dp_sync
        self.vocab_size = self.cfg.vocab_size

        cache = args.cache
        self.kv_format = resolve_kv_cache_format(cache.kv_cache_dtype, self.dtype)
        self.max_total_tokens = self._kv_capacity(local_kv_heads)
        if tp is not None and self.lm_head is not None:  # NOTE: TP ranks: equal pools, the least
            self.max_total_tokens = tp.startup_min("kv_slots", self.max_total_tokens)
        self.kv_pool = TokenToKVPool(
            self.max_total_tokens,
            cache.page_size,
            self.cfg.num_layers,
            local_kv_heads,
            self.cfg.head_dim,
            self.dtype,
            self.device,
            self.kv_format,
        )
        self.req_to_token_pool = ReqToTokenPool(
            args.scheduler.max_running_requests + 8, context_length + 8, self.torch_device
        )
        # NOTE: the native ragged kernel has no logit soft-capping: such models attend through
        # the pure-torch path (their other layer ops stay native)
        softcap = self.cfg.attn_logit_softcapping is not None
        self.attn_backend = create_attention_backend(
            self.attention_backend,
            self.kv_pool,
            self.req_to_token_pool,
            None if softcap else self.native,
            layer_info=self.model.attention_layer_info(),
        )
        self.graph_runner = self._build_graph_runner()
        self.load_seconds = time.perf_counter() - t0
        logger.info(
            "model loaded in %.2f s: %s, dtype %s, KV pool %d tokens (%s), %s kernels, %s attention%s"
            ", quantization %s",
            self.load_seconds,
            self.cfg.architecture,
            self.dtype,
            self.kv_pool.size,
            self.kv_format.name,
            f"native {self.native.isa}" if self.native is not None else "torch",
            self.attention_backend,
            ", native GEMM" if gemm is not None else "",
            self.quantization,
        )

    def release_idle_memory(self) -> None:
        """Give back what only running steps need (the process loop calls this when the queue
        empties): the model's step workspace, and the C heap's free pages, which hold the
        freed transients of the last steps (logits, activations; ~20-35 MB after a batch)."""
        self.model.release_step_memory()
        return_free_heap_to_os()

    @property
    def comm_seconds(self) -> float:
        """Seconds this rank has spent inside tensor-parallel collectives (0 without TP)."""
        return self.tp.comm_seconds if self.tp is not None else 0.0

    @property
    def idle_forwards(self) -> int:
        """DP attention: forwards this rank ran with no tokens of its own (for the others')."""
        return self.dp_sync.idle_forwards if self.dp_sync is not None else 0

    def _kv_capacity(self, kv_heads: int) -> int:
        cache = self.args.cache
        if cache.max_total_tokens is not None:
            return cache.max_total_tokens
        # NOTE: the stored format's bytes, scales included: int8 / fp8 hold ~2x bf16's tokens
        per_token = self.kv_format.bytes_per_token(self.cfg.num_layers, kv_heads, self.cfg.head_dim)
        if self.torch_device.type == "cuda":
            # SGLang's reading of the fraction: of the device memory free once weights are in
            free, _ = torch.cuda.mem_get_info(self.torch_device)
            budget = free * cache.mem_fraction_static
        else:
            import psutil

            budget = psutil.virtual_memory().available * cache.mem_fraction_static
        return kv_capacity_tokens(budget, per_token, cache.page_size)

    # --- CUDA graphs (cuda_graph_runner.py) ---------------------------------------------------

    def _build_graph_runner(self) -> CudaGraphRunner | None:
        """Decode graphs on CUDA unless --disable-cuda-graph (never on CPU)."""
        graphs = self.args.cuda_graph
        if not self.device.startswith("cuda") or graphs.disable_cuda_graph or self.tp is not None:
            return None
        if self.cfg.moe is not None:
            logger.info("CUDA graphs off: MoE layers size their expert groups on the host")
            return None
        if not self.attn_backend.supports_cuda_graph:
            logger.info(
                "CUDA graphs off: the %s attention backend runs decode steps eagerly",
                self.attention_backend,
            )
            return None
        sizes = capture_batch_sizes(
            graphs.cuda_graph_max_bs,
            graphs.cuda_graph_bs,
            self.args.scheduler.max_running_requests,
        )
        return CudaGraphRunner(
            self.model,
            self.attn_backend,
            sizes,
            self.vocab_size,
            self.req_to_token_pool.max_context_len,
            self.device,
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        if self.tp is None:
            return self._forward_local(batch)
        try:
            if self.dp_sync is None:
                return self._forward_tp(batch)
            self.dp_sync.before_forward(batch.num_tokens)  # every rank's token count
            return self._forward_local(batch)
        except Exception as e:
            # NOTE: the other ranks are in this step's collectives: a rank that skips the rest
            # of them can never line up again, so the failure is the group's, not one batch's
            raise CollectiveError(
                f"rank {self.tp.rank}/{self.tp.size}: the forward failed mid-step ({e!r})"
            ) from e

    def _forward_local(self, batch: ForwardBatch) -> LogitsOutput:
        batch = batch.to_device(self.torch_device)
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.replay(batch)
        batch.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata(batch)
        hidden = self.model(batch.input_ids, batch.positions, batch)
        raw = self.model.compute_logits(hidden)
        return LogitsOutput(raw, hidden, self.model.lm_head_weight, self.vocab_size, self.native)

    def _forward_tp(self, batch: ForwardBatch) -> LogitsOutput:
        """One step on this rank's shard. Rank 0 first sends the batch to the others (they call
        this too, from `tp_worker.run_follower`); its logits are the gathered float32 ones (the
        others' are empty: they never sample)."""
        assert self.lm_head is not None
        if self.step_channel is not None:
            self.step_channel.send_forward(batch, self.req_to_token_pool)
        batch.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata(batch)
        hidden = self.model(batch.input_ids, batch.positions, batch)
        full = self.lm_head.logits(hidden)
        raw = (
            full if full is not None else hidden.new_zeros(0, self.vocab_size, dtype=torch.float32)
        )
        return LogitsOutput(raw, hidden, self.lm_head.weight, self.vocab_size, None)
