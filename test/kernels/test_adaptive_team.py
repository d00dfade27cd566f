"""The adaptive team (kernels/cpu/team.c): a caller's kernel regions go to one thread while its
timed regions find the machine oversubscribed, back to the whole team when not, and a kernel's
result never depends on the team.

The controller is driven here with made-up region timings (team_report) so each transition is
checked exactly; the speed it buys is measured by benchmark/bench_contention.py, not here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from radixgen.kernels.cpu import NativeKernels

WINDOW, SOLO_MIN = 32, 512  # team.c's TEAM_WINDOW and TEAM_SOLO_MIN
T = 1e-4  # a region's made-up length, seconds


@pytest.fixture
def team(native: NativeKernels) -> Iterator[NativeKernels]:
    # NOTE: reset first: earlier kernel calls on a busy machine (the suite's background compiles)
    # may have left the team in a solo period, where team_threads() reads 1
    native.team_reset()
    if native.team_threads() < 2:
        pytest.skip("one OpenMP thread: there is no team to adapt")
    yield native
    native.team_reset()


def window(k: NativeKernels, spread: float) -> None:
    """One window of team regions whose threads finished `spread` seconds apart."""
    for i in range(WINDOW):
        k.team_report(2, i * T, spread, (i + 1) * T)


def solo_regions(k: NativeKernels, n: int) -> None:
    for _ in range(n):
        k.team_report(1, 0.0, 0.0, T)


def test_clean_windows_keep_the_team(team: NativeKernels) -> None:
    all_threads = team.team_threads()
    for _ in range(4):
        window(team, 0.2 * T)  # a thread a fifth of a region behind: the team still pays
    stats = team.team_stats()
    assert (stats.timed, stats.late, stats.solo_periods) == (4 * WINDOW, 0, 0)
    assert team.team_threads() == all_threads and stats.adaptive


def test_a_contended_window_sends_the_regions_to_one_thread_and_back(
    team: NativeKernels,
) -> None:
    all_threads = team.team_threads()
    window(team, 0.49 * T)  # below half of the time: two threads are still faster
    assert team.team_threads() == all_threads
    window(team, 0.6 * T)  # above: one thread is faster
    stats = team.team_stats()
    assert (stats.solo_periods, stats.solo_left, stats.late) == (1, SOLO_MIN, WINDOW)
    assert team.team_threads() == 1
    solo_regions(team, SOLO_MIN - 1)
    assert team.team_threads() == 1
    solo_regions(team, 1)
    assert team.team_threads() == all_threads  # the team is tried again
    window(team, 0.9 * T)  # still contended: twice as long alone
    assert team.team_stats().solo_left == 2 * SOLO_MIN
    solo_regions(team, 2 * SOLO_MIN)
    assert team.team_threads() == all_threads
    backoff = team.team_stats().backoff
    window(team, 0.0)  # clean: the next solo period is half as long
    assert team.team_stats().backoff == backoff // 2
    window(team, 0.0)
    window(team, 0.0)
    assert team.team_stats().backoff == SOLO_MIN  # never below the first period's length


def test_a_region_of_one_thread_outside_a_solo_period_changes_nothing(
    team: NativeKernels,
) -> None:
    solo_regions(team, 10)  # e.g. the library loaded with one OpenMP thread
    stats = team.team_stats()
    assert (stats.timed, stats.solo_periods, stats.solo_left) == (0, 0, 0)


def test_the_quantized_gemm_reports_its_regions_and_gives_the_same_result_alone(
    team: NativeKernels,
) -> None:
    """A team size never changes a result: every output is one thread's, in a fixed order."""
    n, k = 200, 576
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    d = (torch.rand(n, k // 32, generator=g) * 0.01).half()
    m = (torch.randn(n, k // 32, generator=g) * 0.01).half()
    w = team.pack_quant(q, d, m, "u4")
    for rows in (1, 5, 70):
        x = torch.randn(rows, k, generator=g).bfloat16()
        team.team_reset()
        on_team = team.linear_quant(x, w, torch.float32)
        assert team.team_stats().timed == 1  # the kernel timed its region
        # its real timing is left out of the made-up window: on a busy machine that region
        # reads as late too, and the window then closes one report early
        team.team_reset()
        window(team, T)  # contended: the next regions run alone
        assert team.team_threads() == 1
        alone = team.linear_quant(x, w, torch.float32)
        assert team.team_stats().solo_left == SOLO_MIN - 1
        assert torch.equal(alone, on_team)


def test_the_environment_switch_turns_it_off() -> None:
    code = (
        "from radixgen.kernels.cpu import load_native_kernels\n"
        "k = load_native_kernels()\n"
        "assert k is not None\n"
        "n = k.team_threads()\n"
        "for i in range(64): k.team_report(2, 0.0, 1.0, 1.0)\n"
        "s = k.team_stats()\n"
        "assert not s.adaptive and s.timed == 0 and s.solo_periods == 0, s\n"
        "assert k.team_threads() == n\n"
    )
    env = {"RADIXGEN_CPU_ADAPTIVE_TEAM": "0", "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
