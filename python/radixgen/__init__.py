"""RadixGen: a programmable structured-generation runtime for LLMs.

Public names are re-exported lazily so `import radixgen` stays light (no torch at import time).
"""

from __future__ import annotations

import importlib
from typing import Any

from radixgen.version import __version__

_LAZY = {
    "Engine": "radixgen.runtime.engine",
    "ServerArgs": "radixgen.server_args",
    "SamplingParams": "radixgen.sampling_params",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'radixgen' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["__version__", *_LAZY]
