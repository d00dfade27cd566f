"""Small helpers shared by every process; torch-free, like the rest of the core."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where RadixGen keeps what it builds once per machine (converted models, compiled
    kernels): $RADIXGEN_CACHE_DIR, or ~/.cache/radixgen. The one place this is computed."""
    root = os.environ.get("RADIXGEN_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "radixgen"


def return_free_heap_to_os() -> None:
    """Give the C heap's free pages back to the OS (glibc `malloc_trim`); a no-op elsewhere.

    NOTE: glibc keeps freed chunks (a step's logits, a load's temporaries) in the process as
    free heap: still in its RSS. The symbol is looked up in the running process, never with
    `ctypes.util.find_library`, which starts a subprocess: this runs on the scheduler's loop.
    """
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return
    trim(0)
