"""Kernel tests run once per native instruction-set variant of this machine's architecture:
the `native` fixture is each variant's kernels (AVX512-BF16, AVX-512, AVX2 on x86-64), and a
variant this CPU cannot run is skipped with the features it lacks (isa.py)."""

from __future__ import annotations

import platform

import pytest
import strict_compiles

from radixgen.kernels.cpu import NativeBuildError, NativeKernels, load_kernels_for_isa
from radixgen.kernels.cpu.isa import VARIANTS, why_not_runnable

MACHINE_ISAS = [v.name for v in VARIANTS if v.machine == platform.machine()]


@pytest.fixture(params=MACHINE_ISAS or ["none"])
def native(request: pytest.FixtureRequest) -> NativeKernels:
    """One variant's kernels (built on first use)."""
    reason = why_not_runnable(request.param)
    if reason is not None:
        pytest.skip(reason)
    try:
        return load_kernels_for_isa(request.param)
    except NativeBuildError as e:  # no compiler: the module's own skip says so
        pytest.skip(str(e))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the strict compiles the selected tests of test_native_build.py will check, at the
    lowest priority, so they run beside the rest of the suite (strict_compiles.py)."""
    wanted = {
        str(item.callspec.params["isa"])
        for item in session.items
        if item.path.name == "test_native_build.py"
        and hasattr(item, "callspec")
        and "isa" in item.callspec.params
    }
    if wanted:
        strict_compiles.start(wanted)


def pytest_sessionfinish(session: pytest.Session) -> None:
    strict_compiles.stop_all()
