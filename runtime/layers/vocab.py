"""The vocabulary's two matrices: the token embedding and the LM head's logits, each served from
its dense weight, a prepacked copy or a quantized one (scheduler process).

The weights stay parameters of the model (`embed_tokens.weight`, `lm_head`, or the embedding
for a tied head) under their checkpoint names; `VocabHead` holds only how steps read them.
"""

from __future__ import annotations

import torch
from torch import nn

from radixgen.kernels.cpu import NativeKernels, PackedLinearWeight, QuantLinearWeight
from radixgen.runtime.layers.linear import PackedWeight, linear, prepack_weight


def vocab_embedding(vocab_size: int, hidden_size: int) -> nn.Embedding:
    """An embedding without a random init.

    NOTE: `_weight` skips nn.Embedding's random init, whose meta-device version imports
    torch._dynamo (over a second of start-up); weights always come from the checkpoint.
    """
    return nn.Embedding(vocab_size, hidden_size, _weight=torch.empty(vocab_size, hidden_size))


class VocabHead:
    """How the embedding lookup and the LM head run: dense, the head prepacked for the GEMM
    (`prepack`), or either kept quantized (`set_quantized_*`)."""

    def __init__(self) -> None:
        self.packed: PackedWeight | None = None  # the LM head laid out for `gemm` / oneDNN
        self.gemm: NativeKernels | None = None
        self.embed_quant: QuantLinearWeight | None = None  # rows dequantized on lookup
        self.head_quant: QuantLinearWeight | None = None  # the LM head kept quantized
        self.quant_kernels: NativeKernels | None = None
        # the head's bf16 copy for steps of `wide_rows` rows or more (`add_wide_copy`): packed
        # for oneDNN, and, for a quantized head, dense for the near-max re-scoring of its logits
        self.wide_packed: torch.Tensor | None = None
        self.wide_dense: torch.Tensor | None = None
        self.wide_rows = 0

    def embed(self, embedding: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """The rows of `ids` (the model dtype)."""
        if self.embed_quant is not None:
            assert self.quant_kernels is not None
            return self.quant_kernels.quant_rows(self.embed_quant, ids)
        rows: torch.Tensor = embedding(ids)
        return rows

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """[M, vocab] in the model dtype (consumers convert the rows they need); float32 from a
        quantized head (exact: no near-tie re-scoring needed). weight: the dense head."""
        if self.wide_packed is not None and hidden.shape[0] >= self.wide_rows:
            return linear(hidden, weight, self.wide_packed)  # bf16: re-scored near the max
        if self.head_quant is not None:
            assert self.quant_kernels is not None
            return self.quant_kernels.linear_quant(hidden, self.head_quant, torch.float32)
        return linear(hidden, weight, self.packed, gemm=self.gemm)

    def prepack(self, weight: torch.Tensor, gemm: NativeKernels | None) -> None:
        """Lay the dense head out for `gemm` (None: oneDNN) unless it is kept quantized."""
        if self.head_quant is None:
            self.packed = prepack_weight(weight, None, gemm)
            self.gemm = gemm

    def wide_copy_bytes(self, weight: torch.Tensor) -> int | None:
        """What `add_wide_copy` would hold (a quantized head: packed and dense copies; a head
        packed for the native GEMM: the packed copy), or None where it takes none."""
        if self.head_quant is not None:
            return 4 * self.head_quant.out_features * self.head_quant.in_features
        if isinstance(self.packed, PackedLinearWeight) and weight.numel():
            return 2 * weight.numel()
        return None

    def add_wide_copy(self, rows: int, weight: torch.Tensor) -> bool:
        """Keep a bf16 copy of the head packed for oneDNN for logits of at least `rows` rows (as
        `Linear.add_wide_copy`): from a quantized head dequantized (then the model's dense head
        is that copy, `CausalLM.lm_head_weight`, for the re-scoring of bf16 logits), or from
        the dense `weight` of a head packed for the native GEMM. False where the head takes no
        copy or oneDNN cannot pack it."""
        w, kernels = self.head_quant, self.quant_kernels
        dense: torch.Tensor | None = None
        if w is not None and kernels is not None:
            dense = kernels.quant_rows(w, torch.arange(w.out_features))
            source = dense
        elif isinstance(self.packed, PackedLinearWeight) and weight.numel():
            source = weight.detach()
        else:
            return False
        packed = prepack_weight(source)
        if not isinstance(packed, torch.Tensor):
            return False
        self.wide_packed, self.wide_dense, self.wide_rows = packed, dense, rows
        return True

    def set_quantized(
        self, packed: QuantLinearWeight, kernels: NativeKernels, embedding: bool, head: bool
    ) -> None:
        """Serve the embedding and/or the head from `packed` (the caller frees the dense one)."""
        self.quant_kernels = kernels
        if embedding:
            self.embed_quant = packed
        if head:
            self.head_quant = packed
