"""One step's logits and their near-max refinement: what the model runner returns and the
sampler, the output processor and the speculative verifier read."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixgen.kernels.device_io import to_device, upload
from radixgen.kernels.grammar_mask import apply_token_bitmask

if TYPE_CHECKING:
    from radixgen.kernels.cpu import NativeKernels


class LogitsOutput:
    """One step's logits in the model dtype, converted to float32 only for rows that need it.

    NOTE: a bf16 logit carries 8 significant bits, so near-ties at the top (common at logit
    magnitudes of 10-30) would make the greedy choice depend on rounding noise. Every consumer
    sees, instead, the float32 dot products of the same hidden state for the tokens within two
    bf16 ulps of each row's maximum (the true maximum is always among them). Greedy rows are
    answered by a native kernel straight from the bf16 logits, without a float32 copy.
    """

    def __init__(
        self,
        raw: torch.Tensor,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        vocab_size: int,
        native: NativeKernels | None,
    ) -> None:
        self.raw = raw  # [M, >= vocab]
        self.hidden = hidden
        self.weight = weight
        self.vocab_size = vocab_size
        self.native = native if raw.dtype == torch.bfloat16 else None
        self.exact = raw.dtype == torch.float32
        # float32 logits on the host (a quantized head): greedy rows by the native argmax
        self.native_argmax = native if self.exact and raw.device.type == "cpu" else None

    @property
    def device(self) -> torch.device:
        return self.raw.device

    def _index(self, rows: list[int] | slice) -> list[int] | slice | torch.Tensor:
        """Rows as an index the logits' device reads without a blocking copy."""
        if isinstance(rows, slice) or self.raw.device.type == "cpu":
            return rows
        if rows == list(range(rows[0] if rows else 0, (rows[-1] + 1) if rows else 0)):
            return slice(rows[0], rows[-1] + 1) if rows else slice(0, 0)
        return to_device(rows, torch.long, self.raw.device)

    def rows_float(self, rows: list[int] | slice) -> torch.Tensor:
        """float32 [R, V] for the given logits rows, near-max refined (a fresh tensor)."""
        index = self._index(rows)
        # NOTE: a fresh tensor even for float32 logits read through a slice (a view): consumers
        # modify it in place, and the logits are inference-mode tensors (a CUDA graph's static
        # output); a list or tensor index has copied already
        out = self.raw[index, : self.vocab_size].to(torch.float32, copy=isinstance(index, slice))
        if out.shape[0] and not self.exact:
            hidden = self.hidden[index].contiguous()
            if self.native is not None:
                self.native.refine_near_max(out, hidden, self.weight)
            elif out.device.type == "cpu":
                refine_near_max(out, hidden, self.weight)
            else:
                refine_near_max_topk(out, hidden, self.weight)
        return out

    def greedy_ids(self, rows: list[int], bitmask: torch.Tensor | None = None) -> torch.Tensor:
        """Refined argmax of the given rows, [len(rows)] long on the logits' device; over the
        tokens a packed grammar bitmask allows (int32 [len(rows), W], row r for rows[r]) when
        one is given. Nothing waits for the device here."""
        if self.native_argmax is not None:
            # float32 logits (a quantized head): the argmax straight from them, no copy
            return self.native_argmax.argmax(self.raw, rows, self.vocab_size, bitmask)
        if self.exact and bitmask is None and self.raw.device.type == "cpu":
            best = self.raw[:, : self.vocab_size].argmax(dim=-1)
            return best if rows == list(range(best.shape[0])) else best[rows]
        if self.native is not None and self.raw.is_contiguous():
            return torch.tensor(
                self.native.greedy_refine(
                    self.raw, self.hidden, self.weight, rows, self.vocab_size, bitmask
                ),
                dtype=torch.long,
            )
        dense = self.rows_float(rows)
        if bitmask is not None:
            apply_token_bitmask(dense, upload(bitmask, dense.device))
        return dense.argmax(dim=-1)

    def greedy(self, rows: list[int], bitmask: torch.Tensor | None = None) -> list[int]:
        """`greedy_ids` as a host list."""
        ids: list[int] = self.greedy_ids(rows, bitmask).tolist()
        return ids


_BF16_REL_ULP = 2.0**-7


def refine_near_max(logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> None:
    """Torch version of the native re-scoring (see `LogitsOutput`): candidates within two bf16
    ulps of each row's maximum get their float32 dot products."""
    top = logits.max(dim=-1, keepdim=True).values
    tol = top.abs() * (2 * _BF16_REL_ULP) + 1e-6
    rows, cols = torch.nonzero(logits >= top - tol, as_tuple=True)
    if rows.numel() == 0:
        return
    exact = (hidden[rows].float() * weight[cols].float()).sum(dim=-1)
    logits[rows, cols] = exact


# candidates re-scored per row on devices where `refine_near_max`'s nonzero would wait for the
# device; more than this many tokens within two ulps of a row's maximum is not seen in practice
_REFINE_TOPK = 16


def refine_near_max_topk(logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor) -> None:
    """`refine_near_max` without a host synchronisation: the row's top `_REFINE_TOPK` logits are
    the candidates, and those within two bf16 ulps of the maximum get their float32 dot products
    (the others keep their values)."""
    k = min(_REFINE_TOPK, logits.shape[-1])
    vals, cols = logits.topk(k, dim=-1)
    top = vals[:, :1]
    near = vals >= top - (top.abs() * (2 * _BF16_REL_ULP) + 1e-6)
    exact = (hidden.float()[:, None, :] * weight[cols].float()).sum(dim=-1)
    logits.scatter_(1, cols, torch.where(near, exact, vals))
