"""Host <-> device transfers for one step without stalls: small host lists go to the device with
non-blocking copies, and a step's results come back in one synchronisation.

NOTE: a blocking host-to-device copy waits for every kernel queued before it, and a non-blocking
one from pageable memory may too (the driver can synchronise to stage it); from pinned memory it
is queued and returns at once. So host data goes through a pinned staging copy (torch's caching
host allocator keeps a staging block until its copy has run). On CPU the helpers return their
inputs unchanged.
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
    return upload(host.to(dtype), device)


def upload(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` on `device`: itself when it is there already (one device of each type is assumed),
    else a copy queued without a host wait (through pinned memory)."""
    device = torch.device(device)
    if t.device.type == device.type:
        return t
    staged = t if t.is_pinned() else t.pin_memory()
    return staged.to(device, non_blocking=True)


class HostCopy:
    """Device tensors on their way to the host: the copies start at construction (queued behind
    the kernels that produce them), and `wait` returns them after one synchronisation."""

    def __init__(self, *tensors: torch.Tensor | None) -> None:
        self._out: list[torch.Tensor | None] = []
        self._event: torch.cuda.Event | None = None
        for t in tensors:
            if t is None or t.device.type == "cpu":
                self._out.append(t)
            else:
                self._out.append(t.to("cpu", non_blocking=True))  # pinned: completes later
                if self._event is None:
                    self._event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        if self._event is not None:
            self._event.record()

    def wait(self) -> list[torch.Tensor | None]:
        """The host copies (None stays None); the first call waits for the device."""
        if self._event is not None:
            self._event.synchronize()  # NOTE: the step's one host synchronisation
            self._event = None
        return self._out
