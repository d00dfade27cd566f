"""The LoRA adapter a program's backend call runs under, client side.

`run(lora_path=...)` names a program's adapter and a gen/select may name another; the executor
sets it in a context variable around each backend call (on the state's worker thread), so every
request that call sends (a select's prefill and scoring, a dtype gen's retries, a fork's prefix
prefill) carries it without the backends passing it along: native payloads as `lora_path`,
OpenAI-compatible ones as the `model` (how SGLang's and vLLM's servers name an adapter).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "radixgen_lora_path", default=None
)


@contextmanager
def using_adapter(lora_path: str | None) -> Iterator[None]:
    """Requests sent inside the block run under `lora_path` (None: the base model)."""
    token = _current.set(lora_path)
    try:
        yield
    finally:
        _current.reset(token)


def current_adapter() -> str | None:
    return _current.get()


def with_adapter(payload: dict[str, Any]) -> dict[str, Any]:
    """A native /generate payload with the current call's `lora_path`, if it has one."""
    lora_path = _current.get()
    return payload if lora_path is None else {**payload, "lora_path": lora_path}
