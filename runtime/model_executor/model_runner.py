"""Loads the model and its KV pools and runs one forward step (scheduler process).

What to run on is decided first (`resolution.py`: device, dtype, backends, kernels,
quantization), the pool is sized after the weights are in (`kv_sizing.py`); this module holds
the runner: loading, the pools, the attention backend, CUDA graphs and the forward.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.attention import create_attention_backend
from radixgen.kernels.cpu import NativeKernels
from radixgen.kernels.kv_quant import resolve_kv_cache_format
from radixgen.kernels.layer_ops import FusedLayerOps
from radixgen.runtime.distributed.parallel_linear import load_sharded_model
from radixgen.runtime.distributed.parallel_state import CollectiveError
from radixgen.runtime.lora.manager import LoraManager
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.model_executor.cuda_graph_runner import CudaGraphRunner, capture_batch_sizes
from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.model_executor.kv_sizing import kv_pool_tokens
from radixgen.runtime.model_executor.logits_output import LogitsOutput
from radixgen.runtime.model_executor.resolution import resolve_runner
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
        choices = resolve_runner(model_folder, args, arch, tp)
        self.device = choices.device
        # NOTE: the one device decision: every tensor the step reads is placed on it here
        self.torch_device = torch.device(self.device)
        self.cfg = choices.cfg
        self.dtype = choices.dtype
        self.attention_backend = choices.attention_backend
        self.context_length = context_length
        self.native: NativeKernels | None = choices.native
        gemm = choices.linear_gemm
        self.linear_gemm = gemm  # the GEMM the linear layers were packed for (None: oneDNN)
        self.layer_ops: FusedLayerOps | None = choices.layer_ops
        self.quantization = choices.quantization
        self.wide_rows: int | None = None  # set once the model kept the bf16 copies (below)
        # NOTE: parameters are allocated once in the target dtype and filled from the mmap'd
        # checkpoint (no random init, no fp32 copy, no meta-device paths importing sympy).
        if tp is None:
            self.model = load_model(
                model_folder, self.cfg, self.dtype, self.device, context_length + 1,
                self.layer_ops, gemm, self.quantization, self.native, choices.wide_rows,
            )  # fmt: skip
            local_kv_heads = self.cfg.num_kv_heads
            self.wide_rows = self.model.wide_rows
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
        # NOTE: every DP replica and TP rank with device "cuda" runs on the current device
        sharing = args.parallel.dp_size * args.parallel.tp_size
        self.max_total_tokens = kv_pool_tokens(
            cache, self.kv_format, self.cfg, local_kv_heads, self.torch_device, sharing
        )
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
        self.lora: LoraManager | None = None
        if args.lora.enabled:
            self.lora = LoraManager(self.model, args.lora, self.dtype, self.torch_device)
        self.load_seconds = time.perf_counter() - t0
        logger.info(
            "model loaded in %.2f s: %s, dtype %s, KV pool %d tokens (%s), %s kernels, %s attention%s"
            ", quantization %s%s",
            self.load_seconds,
            self.cfg.architecture,
            self.dtype,
            self.kv_pool.size,
            self.kv_format.name,
            f"native {self.native.isa}" if self.native is not None else "torch",
            self.attention_backend,
            ", native GEMM" if gemm is not None else "",
            self.quantization,
            f", bf16 copies for steps of {self.wide_rows}+ rows" if self.wide_rows else "",
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
        lora = batch.lora_ids is not None
        if self.graph_runner is not None and not lora and self.graph_runner.can_run(batch):
            return self.graph_runner.replay(batch)
        batch.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata(batch)
        if lora:
            if self.lora is None:
                raise RuntimeError("a step names LoRA adapters but --enable-lora is off")
            self.lora.begin_step(batch)
            try:
                hidden = self.model(batch.input_ids, batch.positions, batch)
            finally:
                self.lora.end_step()
        else:
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
