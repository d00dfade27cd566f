"""Backends behind one interface: RuntimeEndpoint (HTTP), EngineBackend (in-process), OpenAI."""

from __future__ import annotations

import importlib
from typing import Any

from radixgen.lang.backend.base import BaseBackend

_LAZY = {
    "RuntimeEndpoint": "radixgen.lang.backend.runtime_endpoint",
    "EngineBackend": "radixgen.lang.backend.engine",
    "OpenAI": "radixgen.lang.backend.openai",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'radixgen.lang.backend' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["BaseBackend", *_LAZY]
