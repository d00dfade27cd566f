"""Host <-> device transfers for one step without stalls: small host lists go to the device with
non-blocking copies, and a step's results come back in one synchronisation.

NOTE: a blocking host-to-device copy waits for every kernel queued before it; a non-blocking one
does not (from pageable memory the driver stages the bytes first, so the source may be reused at
once). On CPU both helpers return their inputs unchanged.
"""

from __future__ import annotations

import torch


def to_device(
    values: list[int] | list[float] | list[bool] | torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A host list (or CPU tensor) as a tensor of `dtype` on `device`, without a host wait."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return host.to(dtype)
    return host.to(device=device, dtype=dtype, non_blocking=True)


def fetch_to_host(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Copies of device tensors on the host, after one wait for all of them (None stays None)."""
    out: list[torch.Tensor | None] = []
    waits = False
    for t in tensors:
        if t is None or t.device.type == "cpu":
            out.append(t)
        else:
            out.append(t.to("cpu", non_blocking=True))  # into pinned memory: completes later
            waits = True
    if waits:
        torch.cuda.current_stream().synchronize()  # NOTE: the step's one host synchronisation
    return out
