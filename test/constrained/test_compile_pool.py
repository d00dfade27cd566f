"""Grammar compiles in killable worker processes: deadline from start, fair service, byte-bounded
cache, single flight, and no worker left behind (real xgrammar compiles in real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from grammar_helpers import NO_LIMITS, VOCAB_SIZE, make_req, nested_array_schema
from wait_helpers import wait_until

from radixgen.runtime.constrained.grammar_manager import GrammarManager
from radixgen.server_args import GrammarConfig

pytestmark = pytest.mark.slow  # worker processes, deliberate timeouts


def new_manager(tokenizer, **config) -> GrammarManager:
    return GrammarManager(GrammarConfig(**config), tokenizer, VOCAB_SIZE, [2])


def settle(gm: GrammarManager, reqs, timeout: float = 60.0):
    """Poll like the scheduler does; returns (ready, failed, seconds until each settled)."""
    waiting, ready, failed, when = list(reqs), [], [], {}
    start = time.monotonic()
    while waiting:
        assert time.monotonic() - start < timeout, "poll never settled"
        r, f = gm.poll(waiting)
        for x in r + f:
            when[x.rid] = time.monotonic() - start
        ready += r
        failed += f
        done = {id(x) for x in r + f}
        waiting = [x for x in waiting if id(x) not in done]
        time.sleep(0.005)
    return ready, failed, when


def submit_all(gm, reqs):
    for r in reqs:
        gm.submit(r)
    return reqs


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_issue_repro_cheap_regex_is_served_while_deep_schemas_are_killed(tokenizer):
    """Issue 12: three ~900-deep array schemas must not fail another client's `(yes|no)`."""
    gm = new_manager(tokenizer, grammar_compile_timeout=1.0, grammar_max_depth=10_000)
    try:
        deep = [
            make_req(f"deep{i}", limits=NO_LIMITS, json_schema=nested_array_schema(900 + i))
            for i in range(3)
        ]
        submit_all(gm, deep)
        cheap = submit_all(gm, [make_req("cheap", regex="(yes|no)")])
        ready, failed, when = settle(gm, deep + cheap, timeout=120)
        assert [r.rid for r in ready] == ["cheap"]
        # the cheap one had a slot of its own: it never waited for a deep one to time out
        assert when["cheap"] < min(when[f"deep{i}"] for i in range(3))
        for r in failed:
            assert r.finished_reason.status_code == 400
            assert "took longer than 1 s (grammar_compile_timeout)" in r.finished_reason.message
        st = gm.stats()
        assert st.grammar_compile_timeouts == 3 and st.grammar_compile_worker_kills == 3
        # each overrun was stopped: its worker is gone (memory returned), replacements serve
        assert st.grammar_compile_worker_starts >= 4
        ready, _, _ = settle(gm, submit_all(gm, [make_req("after", regex="[0-9]+")]))
        assert ready
    finally:
        gm.shutdown()


def test_deadline_counts_from_the_compile_start_not_from_submission(tokenizer):
    # One worker and eight compiles queued behind each other. The timeout is set from a measured
    # compile (2.5x one compile's round trip), so each compile alone is well inside it while the
    # last one waits about 7 compiles, longer than the timeout, before it starts: on any machine.
    # The probe's first compiles run beside the parent's one-off grammar setup (2 cores here) and
    # took up to 3x a steady compile, so the timeout comes from its third, steady compile.
    probe = new_manager(tokenizer, grammar_compile_workers=1, grammar_max_depth=500)
    try:
        for rid, depth in (("w", 20), ("t0", 99), ("t", 100)):
            (_, _, when) = settle(
                probe,
                submit_all(
                    probe, [make_req(rid, limits=NO_LIMITS, json_schema=nested_array_schema(depth))]
                ),
            )
        one_compile = when["t"]
    finally:
        probe.shutdown()
    timeout = max(2.5 * one_compile, 0.5)
    gm = new_manager(
        tokenizer, grammar_compile_workers=1, grammar_compile_timeout=timeout, grammar_max_depth=500
    )
    try:
        settle(
            gm,
            submit_all(gm, [make_req("w", limits=NO_LIMITS, json_schema=nested_array_schema(20))]),
        )
        reqs = [
            make_req(f"s{d}", limits=NO_LIMITS, json_schema=nested_array_schema(d))
            for d in range(101, 109)
        ]
        ready, failed, _ = settle(gm, submit_all(gm, reqs), timeout=60 + 20 * timeout)
        assert not failed and len(ready) == 8
        st = gm.stats()
        assert st.grammar_compile_timeouts == 0
        assert st.grammar_compile_queue_seconds_max > timeout
    finally:
        gm.shutdown()


def test_requests_waiting_on_one_spec_share_its_timeout(tokenizer):
    gm = new_manager(tokenizer, grammar_compile_timeout=0.5, grammar_max_depth=10_000)
    try:
        schema = nested_array_schema(400)
        reqs = [make_req(f"r{i}", limits=NO_LIMITS, json_schema=schema) for i in range(3)]
        ready, failed, _ = settle(gm, submit_all(gm, reqs))
        assert not ready and len(failed) == 3
        assert len({r.finished_reason.message for r in failed}) == 1
        st = gm.stats()
        assert st.grammar_cache_misses == 1 and st.grammar_cache_hits == 2
        assert st.grammar_compile_timeouts == 1 and st.grammar_cache_entries == 0
    finally:
        gm.shutdown()


def test_cache_is_bounded_by_bytes_with_lru_eviction(tokenizer):
    probe = new_manager(tokenizer)
    try:
        settle(probe, submit_all(probe, [make_req("p", regex="[a-z]{1,8}@[a-z]{1,8}")]))
        one = probe.stats().grammar_cache_bytes
        assert one > 0  # xgrammar's own memory_size_bytes
    finally:
        probe.shutdown()
    gm = new_manager(tokenizer, grammar_cache_max_bytes=int(one * 2.5))
    try:
        specs = [f"[a-z]{{1,8}}@[a-z]{{1,8}}{c}" for c in "abcd"]
        for i, spec in enumerate(specs[:2]):
            settle(gm, submit_all(gm, [make_req(f"r{i}", regex=spec)]))
        settle(gm, submit_all(gm, [make_req("touch", regex=specs[0])]))  # specs[0] is now newest
        for i, spec in enumerate(specs[2:], start=2):
            settle(gm, submit_all(gm, [make_req(f"r{i}", regex=spec)]))
            st = gm.stats()
            assert st.grammar_cache_bytes <= int(one * 2.5)
        st = gm.stats()
        assert st.grammar_cache_evictions == 2 and st.grammar_cache_entries == 2
        assert ("regex", specs[1]) not in gm.cache and ("regex", specs[0]) not in gm.cache
        assert ("regex", specs[3]) in gm.cache and ("regex", specs[2]) in gm.cache
        # an evicted spec compiles again and still works
        ready, _, _ = settle(gm, submit_all(gm, [make_req("back", regex=specs[1])]))
        assert ready and gm.stats().grammar_cache_misses == 5
    finally:
        gm.shutdown()


def test_shutdown_leaves_no_worker_process(tokenizer):
    gm = new_manager(tokenizer)
    settle(gm, submit_all(gm, [make_req("a", regex="a+"), make_req("b", regex="b+")]))
    pids = gm.pool.worker_pids()
    assert pids and all(alive(p) for p in pids)
    # NOTE: workers are forked by this process's forkserver, which stays (idle) until we exit
    ours = {c.pid for c in psutil.Process().children(recursive=True)}
    assert set(pids) <= ours
    gm.shutdown()
    assert not any(alive(p) for p in pids)


_KILLED_PARENT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {helpers!r})
    from grammar_helpers import VOCAB_SIZE, make_req
    from radixgen.runtime.constrained.grammar_manager import GrammarManager
    from radixgen.runtime.text.tokenizer import Tokenizer
    from radixgen.server_args import GrammarConfig

    if __name__ == "__main__":
        gm = GrammarManager(GrammarConfig(), Tokenizer({folder!r}), VOCAB_SIZE, [2])
        reqs = [make_req("a", regex="a+"), make_req("b", regex="b+")]
        for r in reqs:
            gm.submit(r)
        waiting = list(reqs)
        while waiting:
            ready, failed = gm.poll(waiting)
            waiting = [r for r in waiting if r not in ready + failed]
            time.sleep(0.01)
        print(" ".join(map(str, gm.pool.worker_pids())), flush=True)
        time.sleep(600)
    """
)


def test_workers_exit_when_their_scheduler_is_sigkilled(tmp_path, default_model_folder):
    script = tmp_path / "parent.py"
    helpers = str(Path(__file__).parent)
    script.write_text(_KILLED_PARENT.format(helpers=helpers, folder=default_model_folder))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        pids = [int(p) for p in line.split()]
        assert pids and all(alive(p) for p in pids), line
        # the workers and the forkserver they came from: all must go with the "scheduler"
        family = [c.pid for c in psutil.Process(parent.pid).children(recursive=True)]
        assert set(pids) < set(family)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        wait_until(lambda: not any(alive(p) for p in family), 15, what="orphaned processes to exit")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)


def test_thread_backends_fail_overruns_at_the_deadline_without_a_process(tokenizer):
    # outlines-core's Index cannot cross processes: it compiles on a thread, which cannot be
    # stopped, so the waiting requests are failed at the deadline and the slot runs on
    gm = new_manager(tokenizer, grammar_backend="outlines", grammar_compile_timeout=0.3)
    try:
        slow = make_req("slow", regex=r"[a-z]{1,200}@[a-z]{1,200}\.[a-z]{2,50}")  # ~1 s here
        cheap = make_req("cheap", regex="(yes|no)")
        ready, failed, _ = settle(gm, submit_all(gm, [slow, cheap]))
        assert [r.rid for r in ready] == ["cheap"] and [r.rid for r in failed] == ["slow"]
        reason = slow.finished_reason
        assert reason.status_code == 400 and "took longer than 0.3 s" in reason.message
        st = gm.stats()
        assert st.grammar_compile_timeouts == 1 and st.grammar_compile_worker_kills == 0
        assert gm.pool.worker_pids() == []
    finally:
        gm.shutdown()


def test_the_forkserver_drops_only_a_cut_short_start_up_error():
    """A worker the scheduler was still starting when it exited (an Engine closed seconds after
    its start) printed a traceback per worker from the forkserver's child; the forkserver's
    preload (forkserver_hooks) drops those and prints every other error."""
    code = textwrap.dedent(
        """
        import pickle, sys
        from radixgen.runtime.constrained.compile_worker import worker_context
        worker_context("xgrammar")
        import radixgen.runtime.constrained.forkserver_hooks
        for e in (EOFError(), pickle.UnpicklingError("pickle data was truncated"),
                  pickle.UnpicklingError("invalid load key"), ValueError("a real bug")):
            sys.excepthook(type(e), e, None)
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "truncated" not in run.stderr and "EOFError" not in run.stderr
    assert "invalid load key" in run.stderr and "ValueError: a real bug" in run.stderr
