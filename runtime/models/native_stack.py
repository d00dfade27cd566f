"""The Llama decoder's layers as one native call on CPU (kernels/cpu/decoder_stack.c).

Runs in the scheduler process. The per-layer Python path calls ~9 native kernels a layer; at a
few rows a step that glue (ctypes marshalling, a torch allocation per output, module calls) costs
about as much as streaming the quantized weights. The stack runs the same kernels in the same
order from one table of pointers, so its rows are bitwise those of the per-layer path
(test/models/test_native_stack.py), which stays the path for everything the stack does not
cover: other layer classes (Qwen3's q/k norms, Gemma 2's block, MoE blocks), tensor parallelism,
the torch GEMM or attention, CUDA. RADIXGEN_NATIVE_STACK=0 turns it off (comparisons).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.attention.base import KVPool, kv_scales
from radixgen.kernels.cpu import NativeKernels, PackedLinearWeight, QuantLinearWeight
from radixgen.kernels.cpu.bindings import KV_CODES
from radixgen.runtime.layers.attention import Attention
from radixgen.runtime.layers.decoder import DecoderLayer
from radixgen.runtime.layers.linear import Linear
from radixgen.runtime.layers.mlp import MLP
from radixgen.runtime.layers.norm import RMSNorm

if TYPE_CHECKING:
    from radixgen.kernels.step_cancel import CancelFlag

    from .causal_lm import CausalLM

logger = logging.getLogger(__name__)

DISABLE_ENV = "RADIXGEN_NATIVE_STACK"  # "0": the per-layer path (comparisons)
# NOTE: ~27 KB a row for the default model: a 512-token chunk's 14 MB stays while steps run
# (`release_workspace` drops it when the scheduler goes idle), longer ones' go at once
KEEP_WORKSPACE_BYTES = 16 << 20
# the per-layer words of the table, in decoder_stack.c's enum order
LAYER_WORDS = (
    "in_norm", "post_norm",
    "qkv", "qkv_fmt", "qkv_bias", "o", "o_fmt", "o_bias",
    "gate_up", "gate_up_fmt", "gate_up_bias", "down", "down_fmt", "down_bias",
    "k_pool", "v_pool", "k_scale", "v_scale", "window",
)  # fmt: skip


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _linear_words(layer: Linear, kernels: NativeKernels) -> tuple[int, int, int] | None:
    """(weight, format code, bias) of a natively packed layer, or None (torch / oneDNN)."""
    packed = layer.packed
    if isinstance(packed, PackedLinearWeight):
        if packed.in_features % 2:  # gemm_bf16 reads k-pairs: the per-layer path pads odd k
            return None
        return packed.data.data_ptr(), -1, _ptr(packed.bias)
    if isinstance(packed, QuantLinearWeight):
        return packed.data.data_ptr(), kernels.quant_code(packed), _ptr(packed.bias)
    return None


@dataclass
class NativeDecoderStack:
    """The table of one model's layers over one KV pool, and the kernels that run it."""

    kernels: NativeKernels
    pool: KVPool  # the pool whose per-layer buffers the table points at
    layers: torch.Tensor  # int64 [L, len(LAYER_WORDS)]
    dims: torch.Tensor  # int64 [hidden, H, Hkv, D, inter, kv code]
    geometry: tuple[int, int, int, int, int]  # hidden, H, Hkv, D, inter
    eps: float
    scale: float
    rotary: tuple[torch.Tensor, torch.Tensor]  # the model's float32 cos / sin tables
    final_norm: torch.Tensor  # bf16 [hidden]: the model's final RMSNorm weight
    work: torch.Tensor  # uint8 workspace, grown to the largest step seen (up to a cap)

    @classmethod
    def build(
        cls, model: CausalLM, pool: KVPool, kernels: NativeKernels
    ) -> NativeDecoderStack | None:
        """The stack for `model` over `pool`, or None where a layer is not exactly the pre-norm
        `DecoderLayer` of `Attention`, `MLP` and `RMSNorm` (runtime/layers). Subclasses (Qwen3's
        q/k norms, Gemma 2's, TP layers) add steps the stack does not run: exact classes only."""
        if os.environ.get(DISABLE_ENV) == "0":
            return None
        if kernels.decoder_stack_words != len(LAYER_WORDS):
            raise RuntimeError("decoder_stack.c's layer table does not match LAYER_WORDS")
        cfg = model.cfg
        rows: list[list[int]] = []
        first = model.layers[0]
        if type(first) is not DecoderLayer or type(first.self_attn) is not Attention:
            return None
        if type(first.mlp) is not MLP or type(first.input_layernorm) is not RMSNorm:
            return None
        for i, layer in enumerate(model.layers):
            if type(layer) is not DecoderLayer or type(layer.self_attn) is not Attention:
                return None
            attn, mlp = layer.self_attn, layer.mlp
            if type(mlp) is not MLP or attn.native is not kernels or mlp.native is not kernels:
                return None
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            if any(type(n) is not RMSNorm or n.weight.dtype != torch.bfloat16 for n in norms):
                return None
            if (attn.info.scaling, attn.info.logit_softcap) != (first.self_attn.info.scaling, None):
                return None
            modules = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            if any(type(m) is not Linear for m in modules):  # e.g. tensor-parallel layers
                return None
            linears = [_linear_words(m, kernels) for m in modules]
            if any(w is None for w in linears):
                return None
            k_buf, v_buf = pool.get_kv_buffer(i)
            if k_buf.device.type != "cpu" or not k_buf.is_contiguous():
                return None
            scales = kv_scales(pool, i)
            row = [layer.input_layernorm.weight.data_ptr(), norms[1].weight.data_ptr()]
            for words in linears:
                assert words is not None
                row += words
            row += [k_buf.data_ptr(), v_buf.data_ptr()]
            row += [0, 0] if scales is None else [scales[0].data_ptr(), scales[1].data_ptr()]
            row.append(attn.info.sliding_window or 0)
            rows.append(row)
        final = model.norm
        if type(final) is not RMSNorm or final.weight.dtype != torch.bfloat16:
            return None
        if final.eps != first.input_layernorm.eps:  # the stack norms with one epsilon
            return None
        kv_code = KV_CODES[pool.get_kv_buffer(0)[0].dtype]
        dims = [cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim]
        dims += [first.mlp.inter, kv_code]
        return cls(
            kernels,
            pool,
            torch.tensor(rows, dtype=torch.long),
            torch.tensor(dims, dtype=torch.long),
            (dims[0], dims[1], dims[2], dims[3], dims[4]),
            float(first.input_layernorm.eps),
            float(first.self_attn.info.scaling),
            (model.rotary.cos, model.rotary.sin),
            final.weight.detach(),
            torch.empty(0, dtype=torch.uint8),
        )

    def release_workspace(self) -> None:
        """Free the kept workspace (the next step allocates one again)."""
        self.work = torch.empty(0, dtype=torch.uint8)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        out_cache_loc: torch.Tensor,
        ragged: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        rows: torch.Tensor | None,
        cancel: CancelFlag | None = None,
    ) -> torch.Tensor:
        """The final-normed hidden states (bf16 [M, hidden]) of `rows` (None: all) from the
        embeddings x (bf16 [N, hidden]): what the per-layer path and the final norm give.
        StepCancelled when `cancel` is set before a layer."""
        n = x.shape[0]
        hidden = self.geometry[0]
        need = self.kernels.decoder_stack_workspace_bytes(n, *self.geometry)
        work = self.work
        if work.numel() < need:
            work = torch.empty(need, dtype=torch.uint8)
            if need <= KEEP_WORKSPACE_BYTES:  # decode-sized: kept; a long prefill's is freed
                self.work = work
        out = torch.empty((n if rows is None else rows.shape[0], hidden), dtype=torch.bfloat16)
        self.kernels.decoder_stack_forward(
            self.layers, self.dims, self.eps, self.scale, *self.rotary, x.contiguous(),
            self.final_norm, None if rows is None else rows.contiguous(), out,
            positions.contiguous(), out_cache_loc.contiguous(), ragged, work, cancel,
        )  # fmt: skip
        return out
