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
REQUIRE_ENV = "RADIXGEN_REQUIRE_NATIVE"  # "1": a failed build is an error, not a fallback


@cache
def load_native_kernels() -> NativeKernels | None:
    """The compiled kernels, or None: disabled (RADIXGEN_DISABLE_NATIVE=1, which wins), or
    unavailable (no compiler, a compile or a load error; logged). Under
    RADIXGEN_REQUIRE_NATIVE=1 unavailable raises NativeBuildError instead."""
    if os.environ.get(DISABLE_ENV) == "1":
        return None
    try:
        return NativeKernels(open_library())
    except NativeBuildError as e:
        if os.environ.get(REQUIRE_ENV) == "1":
            raise NativeBuildError(
                f"{REQUIRE_ENV}=1 but the native CPU kernels are unavailable: {e}"
            ) from e
        logger.warning("native CPU kernels unavailable, using the torch path: %s", str(e)[:2000])
        return None
