"""Load (building on first use) and bind the native CPU kernels, or say why not (scheduler
process)."""

from __future__ import annotations

import logging
import os
from functools import cache

from .bindings import NativeKernels
from .build import NativeBuildError, open_library

logger = logging.getLogger(__name__)

DISABLE_ENV = "RADIXGEN_DISABLE_NATIVE"  # "1": always the torch path


@cache
def load_native_kernels() -> NativeKernels | None:
    """The compiled kernels, or None: disabled (RADIXGEN_DISABLE_NATIVE=1), or unavailable (no
    compiler, a compile or a load error; logged) and callers use the torch path."""
    if os.environ.get(DISABLE_ENV) == "1":
        return None
    try:
        return NativeKernels(open_library())
    except NativeBuildError as e:
        logger.warning("native CPU kernels unavailable, using the torch path: %s", str(e)[:2000])
        return None
