"""Small helpers shared by every process; torch-free, like the rest of the core."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where RadixGen keeps what it builds once per machine (converted models, compiled
    kernels): $RADIXGEN_CACHE_DIR, or ~/.cache/radixgen. The one place this is computed."""
    root = os.environ.get("RADIXGEN_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "radixgen"
