"""What one forward step runs: the flat token batch and its per-request layout (scheduler process)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.device_io import upload

if TYPE_CHECKING:
    from radixgen.kernels.attention import AttentionBackend
    from radixgen.kernels.step_cancel import CancelFlag


@dataclass
class ForwardBatch:
    """Tensors for the model plus CPU-side lists for the attention backend's metadata.

    Request i contributes `extend_lens[i]` new tokens (1 for decode) at flat offsets
    `extend_start_loc[i]`, on top of `prefix_lens[i]` tokens already in the KV pool.
    """

    input_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    out_cache_loc: torch.Tensor  # [N] KV slot of each new token
    req_pool_indices_cpu: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    extend_start_loc: list[int]
    logits_indices: torch.Tensor | None  # flat positions whose logits are needed
    attn_backend: AttentionBackend | None = None  # set by ModelRunner.forward
    # per request row, whether it verifies a speculative draft (None: no row does): each of its
    # tokens stands where a decode step would have put it, not in a prompt chunk
    draft_rows: list[bool] | None = None
    # per request row, the LoRA adapter it runs under (None: the base model); the whole list is
    # None when no row of the step has one, so such steps take the base path unchanged
    lora_ids: list[str | None] | None = None
    # set by another thread to stop the forward before its next layer (StepCancelled); None: the
    # step runs whole (see kernels/step_cancel.py)
    cancel: CancelFlag | None = None

    def to_device(self, device: torch.device) -> ForwardBatch:
        """This batch with its tensors on `device`, moved in one non-blocking copy (itself on CPU).

        The scheduler builds batches on the host; the lists stay there for the backends' planning.
        """
        if self.input_ids.device.type == device.type:  # NOTE: one device of each type
            return self
        parts = [self.input_ids, self.positions, self.out_cache_loc]
        if self.logits_indices is not None:
            parts.append(self.logits_indices)
        sizes = [int(t.numel()) for t in parts]
        moved = torch.split(upload(torch.cat(parts), device), sizes)
        return replace(
            self,
            input_ids=moved[0],
            positions=moved[1],
            out_cache_loc=moved[2],
            logits_indices=moved[3] if self.logits_indices is not None else None,
        )

    @property
    def batch_size(self) -> int:
        return len(self.extend_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return all(e == 1 for e in self.extend_lens)
