"""The post-norm encoder block of BERT-family models: bidirectional self-attention and a GELU
MLP, each followed by residual add + LayerNorm (scheduler process).

An encoder sees its whole input at once and keeps nothing for later tokens, so attention is a
plain batched `scaled_dot_product_attention` over right-padded sequences (padding keys masked),
not the paged-KV attention of the decoders.

On the CPU in float32 the GEMMs run on oneDNN with weights packed once (`prepack`): query, key
and value as one fused GEMM, and the residual add folded into the output and down GEMMs. Measured
on all-MiniLM-L6-v2 (2 AVX2 cores), oneDNN's packed GEMMs are 1.04-1.20x MKL's per call at 2,048
rows, the fused QKV saves two passes over the input; `EmbeddingRunner` keeps sub-batches near
2,048 tokens so the MLP's 4x-wide activation stays in cache. Elsewhere (CUDA, bf16, no oneDNN)
the plain `F.linear` path runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.runtime.layers.linear import Linear

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
# oneDNN's layout hint: the rows a packed weight is tuned for (any row count still works)
_PACK_ROWS_HINT = 2048


def can_pack_dense(weight: torch.Tensor) -> bool:
    """oneDNN serves float32 CPU weights (bf16 and CUDA keep F.linear)."""
    return (
        weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]  # unannotated in torch
    )


@dataclass(frozen=True)
class DenseGemm:
    """y = x W^T + b (+ residual) from a weight oneDNN packed once; unpacked (`packed` False)
    it is F.linear on the [N, K] weight (the oracle, and the path without oneDNN)."""

    weight: torch.Tensor  # oneDNN's blocked layout when `packed`, else the [N, K] weight
    bias: torch.Tensor | None
    packed: bool

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool) -> DenseGemm:
        w = weight.detach().contiguous()
        if pack and can_pack_dense(w):
            blocked = torch.ops.mkldnn._reorder_linear_weight(w, _PACK_ROWS_HINT)
            return cls(blocked, bias, True)
        return cls(w, bias, False)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] (and residual [M, N]) -> [M, N]."""
        if self.packed:
            if residual is None:
                out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                    x, self.weight, self.bias, "none", [], ""
                )
                return out
            fused: torch.Tensor = torch.ops.mkldnn._linear_pointwise.binary(
                x, residual, self.weight, self.bias, "add"
            )
            return fused
        y = F.linear(x, self.weight, self.bias)
        return y if residual is None else y + residual


class BidirectionalAttention(nn.Module):
    """Multi-head self-attention where every token sees every real token of its sequence."""

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.query = Linear(hidden_size, hidden_size)
        self.key = Linear(hidden_size, hidden_size)
        self.value = Linear(hidden_size, hidden_size)
        self.out = Linear(hidden_size, hidden_size)
        self.qkv: DenseGemm | None = None  # set by `prepack`
        self.out_gemm: DenseGemm | None = None

    def prepack(self, pack: bool = True) -> None:
        """Fuse query/key/value into one GEMM and pack the weights (call after loading)."""
        q, k, v = self.query, self.key, self.value
        bias = torch.cat((q.bias, k.bias, v.bias))
        self.qkv = DenseGemm.of(torch.cat((q.weight, k.weight, v.weight)), bias, pack)
        self.out_gemm = DenseGemm.of(self.out.weight, self.out.bias, pack)

    def forward(
        self, x: torch.Tensor, key_mask: torch.Tensor, shape: tuple[int, int]
    ) -> torch.Tensor:
        """x [B*L, H] (B sequences right-padded to L, `shape` = (B, L)); key_mask [B, 1, 1, L]
        bool (True: a real token) -> x + attention(x), [B*L, H]."""
        assert self.qkv is not None and self.out_gemm is not None, "call prepack() after loading"
        (b, n), h = shape, x.shape[-1]
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, h // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B, heads, L, head_dim]
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.out_gemm(attn.transpose(1, 2).reshape(b * n, h), residual=x)


class PostNormEncoderLayer(nn.Module):
    """x = norm(x + attn(x)); x = norm(x + down(act(up(x))))."""

    def __init__(
        self, hidden_size: int, num_heads: int, intermediate_size: int, eps: float, act: str
    ) -> None:
        super().__init__()
        self.attn = BidirectionalAttention(hidden_size, num_heads)
        self.attn_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.up = Linear(hidden_size, intermediate_size)
        self.down = Linear(intermediate_size, hidden_size)
        self.mlp_norm = nn.LayerNorm(hidden_size, eps=eps)
        self.act = ACTIVATIONS[act]
        self.up_gemm: DenseGemm | None = None  # set by `prepack`
        self.down_gemm: DenseGemm | None = None

    def prepack(self, pack: bool = True) -> None:
        """Lay the weights out for `forward` (pack=False: plain F.linear, the oracle); once,
        after loading."""
        a = self.attn
        a.prepack(pack)
        self.up_gemm = DenseGemm.of(self.up.weight, self.up.bias, pack)
        self.down_gemm = DenseGemm.of(self.down.weight, self.down.bias, pack)
        for linear in (a.query, a.key, a.value, a.out, self.up, self.down):
            # the GEMMs hold the only copy now (a checkpoint loads into a fresh model)
            empty = torch.empty(0, dtype=linear.weight.dtype, device=linear.weight.device)
            linear.weight = nn.Parameter(empty, False)

    def forward(
        self, x: torch.Tensor, key_mask: torch.Tensor, shape: tuple[int, int]
    ) -> torch.Tensor:
        """x [B*L, H] -> [B*L, H]; see `BidirectionalAttention.forward`."""
        assert self.up_gemm is not None and self.down_gemm is not None, "call prepack()"
        x = self.attn_norm.forward(self.attn.forward(x, key_mask, shape))
        return self.mlp_norm.forward(self.down_gemm(self.act(self.up_gemm(x)), residual=x))
