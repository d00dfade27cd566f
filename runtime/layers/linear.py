"""Linear layers for the CPU path: prepacked bf16 weights, batch-invariant rows.

Runs in the scheduler process.
- Native GEMM (kernels/cpu/gemm_bf16.c) on CPUs with AVX512-BF16 and no AMX: the weight is
  packed once at load time; every output element is one float32 accumulator over k in order, so
  rows are bitwise the same alone or batched for every M. Measured on this machine for the
  default model's 30 layers against oneDNN's prepacked path: 2.5x faster at 2 rows (weight
  streaming), 1.35x at 16, 1.4x at 64, 1.06x at 1024 (benchmark/bench_offline.py reports the
  end-to-end effect).
- oneDNN otherwise (`torch.ops.mkldnn._reorder_linear_weight`, also prepacked; on AMX machines
  it uses the tile unit, which this kernel does not): every M >= 2 computes each row
  identically (torch 2.13), a single row (M = 1) may not (K = 1536), so one row is padded to two.
  MKL's float32 GEMM changes row results with M, so float32 is exact but not batch-invariant.
- A weight kept quantized (gemm_quant.c) or packed for the native GEMM may also keep a bf16
  copy packed for oneDNN (`add_wide_copy`, opt-in: `radixgen.kernels.cpu.select_wide_rows`):
  steps of many rows take it, as AMX's tile unit beats the vector GEMMs there, and small steps
  keep the native weight (fewer bytes to stream, and the native decoder stack). A row's result
  then depends on which side of the threshold its step fell.
- RADIXGEN_NATIVE_GEMM=0 forces oneDNN (for comparisons). The model runner makes the choice once
  (`radixgen.kernels.cpu.select_linear_gemm`) and hands it to `prepack`.
"""

from __future__ import annotations

from functools import cache
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.kernels.cpu import NativeKernels, PackedLinearWeight, QuantLinearWeight

_PACK_BATCH_HINT = 2  # other hints (16, 64) made single rows differ from batched ones

# A weight laid out once at load time: for the native GEMM (bf16 or kept quantized), or oneDNN's
# blocked tensor.
PackedWeight = PackedLinearWeight | QuantLinearWeight | torch.Tensor


def prepack_weight(
    weight: torch.Tensor, bias: torch.Tensor | None = None, gemm: NativeKernels | None = None
) -> PackedWeight | None:
    """The weight laid out for the fastest batch-invariant path, or None where there is none.

    gemm: the native kernels when their GEMM serves the linear layers (the model runner's
    choice, `select_linear_gemm`), else None for oneDNN."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return None
    if gemm is not None:
        return gemm.pack_linear(weight, bias)
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]  # unannotated in torch
        return None
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
            weight.detach(), _PACK_BATCH_HINT
        )
    except (RuntimeError, AttributeError):
        return None
    return packed


@cache
def onednn_packs_bf16() -> bool:
    """Can oneDNN lay out bf16 weights on this CPU? It needs AVX512-BW/VL/DQ or AVX-NE-CONVERT
    (AVX2-only CPUs run bf16 layers through F.linear instead)."""
    return isinstance(prepack_weight(torch.zeros(2, 2, dtype=torch.bfloat16)), torch.Tensor)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    packed: PackedWeight | None,
    bias: torch.Tensor | None = None,
    unrounded: bool = False,
    gemm: NativeKernels | None = None,
) -> torch.Tensor:
    """y = x W^T + b with the prepacked weight when there is one.

    gemm: the kernels that packed `packed` when it is a PackedLinearWeight.
    unrounded: the native GEMM may return float32 instead of rounding to bf16 (for outputs that
    only feed the float32 residual stream); other paths return the input dtype regardless.
    """
    if isinstance(packed, PackedLinearWeight):
        assert gemm is not None, "a natively packed weight needs the kernels that packed it"
        out = torch.float32 if unrounded else torch.bfloat16
        return gemm.linear_bf16(x, packed, out)  # the bias was packed with the weight
    if isinstance(packed, QuantLinearWeight):
        assert gemm is not None, "a quantized weight needs the kernels that packed it"
        out = torch.float32 if unrounded else torch.bfloat16
        return gemm.linear_quant(x, packed, out)
    # oneDNN's batch invariance needs M >= 2 (see the module docstring); CUDA needs no padding
    single = x.shape[0] == 1 and x.dtype == torch.bfloat16 and x.device.type == "cpu"
    if single:
        x = torch.cat((x, x))
    if packed is not None:
        y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    else:
        y = F.linear(x, weight, bias)
    return y[:1] if single else y


class LinearDelta(Protocol):
    """Something added to a linear layer's output for some rows (a LoRA adapter's x A^T B^T),
    kept behind this protocol so the layers import nothing of the LoRA package."""

    def add_to(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (the base output of x) with the delta added; may update y in place."""
        ...


class Linear(nn.Linear):
    packed: PackedWeight | None = None
    gemm: NativeKernels | None = None  # the native GEMM serving this layer (set by `prepack`)
    # NOTE: None (the class default) unless --enable-lora attached adapters' slots: the base
    # path pays one attribute test a call
    delta: LinearDelta | None = None
    # a bf16 copy of the weight packed for oneDNN, serving calls of at least `wide_rows` rows
    # (`add_wide_copy`; None, the class default: every call takes `packed`)
    wide: torch.Tensor | None = None
    wide_rows: int = 0
    wide_bias: torch.Tensor | None = None

    def prepack(self, gemm: NativeKernels | None = None) -> None:
        """Call once the weights are loaded (and whenever they change); gemm: see
        `prepack_weight`. A quantized weight (`set_quantized`) stays as it is."""
        if isinstance(self.packed, QuantLinearWeight):
            return
        if self.dense_released:
            if gemm is self.gemm:
                return  # packed for these kernels already
            raise RuntimeError("this layer's dense weight was released: reload it to repack")
        self.gemm = gemm
        self.packed = prepack_weight(self.weight, self.bias, gemm)

    @property
    def dense_released(self) -> bool:
        return self.packed is not None and self.weight.numel() == 0

    def release_dense(self) -> None:
        """Free the dense weight when a packed copy serves every call (the native GEMM's or
        oneDNN's layout): a bf16 model otherwise holds its linear layers twice."""
        if isinstance(self.packed, (PackedLinearWeight, torch.Tensor)):
            self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype), requires_grad=False)

    def set_quantized(self, packed: QuantLinearWeight, kernels: NativeKernels) -> None:
        """Serve this layer from a quantized weight (gemm_quant.c); the dense weight is freed."""
        self.packed, self.gemm = packed, kernels
        self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype), requires_grad=False)

    def wide_copy_bytes(self) -> int | None:
        """What `add_wide_copy` would hold, or None where this layer takes no copy (it is
        neither kept quantized nor packed for the native GEMM with its dense weight here)."""
        w = self.packed
        if isinstance(w, QuantLinearWeight) and self.gemm is not None:
            return 2 * w.out_features * w.in_features
        if isinstance(w, PackedLinearWeight) and (self.wide is not None or not self.dense_released):
            return 2 * w.out_features * w.in_features
        return None

    def add_wide_copy(self, rows: int) -> bool:
        """Keep a bf16 copy of this layer's weight packed for oneDNN, for calls of at least
        `rows` rows (see the module docstring): from the quantized weight dequantized, or from
        the dense weight of a layer packed for the native GEMM (call it before
        `release_dense`). False where the layer takes no copy or oneDNN cannot pack it."""
        w = self.packed
        if isinstance(w, QuantLinearWeight) and self.gemm is not None:
            dense = self.gemm.quant_rows(w, torch.arange(w.out_features))
            bias = None if w.bias is None else w.bias.to(torch.bfloat16)
        elif isinstance(w, PackedLinearWeight) and not self.dense_released:
            dense, bias = self.weight.detach(), self.bias
        elif isinstance(w, PackedLinearWeight) and self.wide is not None:
            self.wide_rows = rows  # a repack after the dense weight was freed: keep the copy
            return True
        else:
            return False
        wide = prepack_weight(dense)
        if not isinstance(wide, torch.Tensor):
            return False
        self.wide, self.wide_rows = wide, rows
        self.wide_bias = None if bias is None else bias.detach()
        return True

    def forward(self, x: torch.Tensor, unrounded: bool = False) -> torch.Tensor:
        """unrounded: the caller takes float32 (see `linear`)."""
        if self.wide is not None and x.shape[0] >= self.wide_rows:
            y = linear(x, self.weight, self.wide, self.wide_bias)
        else:
            y = linear(x, self.weight, self.packed, self.bias, unrounded, self.gemm)
        return y if self.delta is None else self.delta.add_to(x, y)
