"""The post-norm encoder block of BERT-family models: bidirectional self-attention and a GELU
MLP, each followed by residual add + LayerNorm (scheduler process).

An encoder sees its whole input at once and keeps nothing for later tokens, so attention is a
plain batched `scaled_dot_product_attention` over right-padded sequences (padding keys masked),
not the paged-KV attention of the decoders.
"""

from __future__ import annotations

from collections.abc import Callable

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


class BidirectionalAttention(nn.Module):
    """Multi-head self-attention where every token sees every real token of its sequence."""

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.query = Linear(hidden_size, hidden_size)
        self.key = Linear(hidden_size, hidden_size)
        self.value = Linear(hidden_size, hidden_size)
        self.out = Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x [B, L, H]; key_mask [B, 1, 1, L] bool (True: a real token) -> [B, L, H]."""
        b, n, h = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.num_heads, h // self.num_heads).transpose(1, 2)

        q = heads(self.query.forward(x))
        k, v = heads(self.key.forward(x)), heads(self.value.forward(x))
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
        return self.out.forward(attn.transpose(1, 2).reshape(b, n, h))


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

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm.forward(x + self.attn.forward(x, key_mask))
        return self.mlp_norm.forward(x + self.down.forward(self.act(self.up.forward(x))))
