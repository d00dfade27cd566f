"""Cutting a forward short between layers (scheduler process, CPU).

On a CPU a step of batch lines takes ~100 ms, and an interactive request that arrives while it
runs would wait for all of it. The scheduler gives such a step's forward a `CancelFlag`; another
thread sets the flag when an interactive request comes in, and the forward stops before its next
layer (the native decoder stack reads the flag's int32 through its address, the per-layer path
through `raise_if_cancelled`) by raising `StepCancelled`. The caller frees the step's KV slots,
so the KV already written for it is never read.
"""

from __future__ import annotations

import ctypes


class StepCancelled(Exception):
    """The forward stopped before a layer because its step was cancelled."""


class CancelFlag:
    """An int32 another thread may set while a forward runs (a relaxed store; read between
    layers)."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = ctypes.c_int32(0)

    def set(self) -> None:
        self._value.value = 1

    def clear(self) -> None:
        self._value.value = 0

    def is_set(self) -> bool:
        return bool(self._value.value)

    @property
    def address(self) -> int:
        """Where native code reads the flag."""
        return ctypes.addressof(self._value)


def raise_if_cancelled(flag: CancelFlag | None) -> None:
    if flag is not None and flag.is_set():
        raise StepCancelled
