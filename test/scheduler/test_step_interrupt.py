"""A step of batch lines cut short for an interactive arrival (runtime/scheduler/step_interrupt.py):
the doorbell's bookkeeping, the ring through a real ZMQ socket, and the Scheduler with the toy
runner (a cut step leaves wrong KV in its slots; every output must stay exact, the KV accounting
is checked after each step)."""

from __future__ import annotations

import time

import zmq
from toy_runner import make_scheduler, reference_output, run_to_end

from radixgen.io_struct import TokenizedGenerateReq, apply_delta
from radixgen.runtime.launch.process_utils import doorbell_endpoint
from radixgen.runtime.scheduler import step_interrupt
from radixgen.runtime.scheduler.scheduler import Scheduler
from radixgen.runtime.scheduler.step_interrupt import StepInterrupt
from radixgen.sampling_params import SamplingParams


def _submit(s: Scheduler, rid: str, prompt: list[int], background: bool, n: int = 6) -> None:
    sp = SamplingParams.from_dict({"max_new_tokens": n, "temperature": 0})
    s.add_request(
        TokenizedGenerateReq(rid, prompt, sp, arrival_time=time.time(), background=background)
    )


def _prompt(seed: int, n: int = 40) -> list[int]:
    return [(seed * 7 + i * 3) % 45 + 2 for i in range(n)]


def _interruptible(**flags: object) -> Scheduler:
    s, _ = make_scheduler(chunked_prefill_size=16, **flags)
    s.interrupt = StepInterrupt()
    return s


# --- the doorbell's bookkeeping ----------------------------------------------------------------


def test_a_ring_cuts_the_armed_step_only_for_a_request_not_read_yet():
    bell = StepInterrupt()
    assert not bell.arm().is_set()
    bell.ring("a")  # while armed: the step in flight stops
    assert bell.flag.is_set()
    bell.disarm(cut=False)  # it had passed its last layer
    assert not bell.flag.is_set()
    assert bell.arm().is_set()  # "a" rang and was not read: the next step stops at once
    bell.disarm(cut=True)
    assert not bell.arm().is_set()  # a ring cuts one step at most
    bell.disarm(cut=False)
    bell.on_request("a")
    assert not bell._read  # matched with its spent ring
    assert not bell.arm().is_set()
    bell.on_request("b")  # read before its ring (two sockets, no order between them)
    bell.ring("b")
    assert not bell.flag.is_set()
    bell.disarm(cut=False)
    assert not bell.arm().is_set()
    bell.disarm(cut=False)


def test_a_ring_whose_request_never_comes_expires(monkeypatch):
    bell = StepInterrupt()
    bell.ring("lost")
    assert bell.arm().is_set()
    bell.disarm(cut=False)
    now = time.monotonic()
    monkeypatch.setattr(step_interrupt.time, "monotonic", lambda: now + step_interrupt.STALE_S + 1)
    assert not bell.arm().is_set()
    bell.disarm(cut=False)


def test_the_doorbell_thread_sets_the_armed_flag(tmp_path):
    ctx = zmq.Context()
    try:
        endpoint = doorbell_endpoint(f"ipc://{tmp_path}/scheduler")
        bell = StepInterrupt()
        bell.listen(ctx, endpoint)
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(endpoint)
        flag = bell.arm()
        push.send(b"rid-1")
        deadline = time.monotonic() + 5
        while not flag.is_set():
            assert time.monotonic() < deadline, "the ring did not set the flag"
            time.sleep(0.005)
        bell.disarm(cut=False)
        push.close()
    finally:
        ctx.destroy(linger=0)


# --- the scheduler -------------------------------------------------------------------------------


def test_a_cut_step_frees_its_slots_and_the_interactive_prefill_runs_alone():
    s = _interruptible()
    prompts = {f"line{i}": _prompt(i) for i in range(4)}
    for rid, p in prompts.items():
        _submit(s, rid, p, background=True)
    s.step()
    s.step()  # batch lines part-way through their chunked prefills
    free, kv_lens = s.kv_pool.available_size(), {r.rid: r.kv_len for r in s.running}
    steps, batches = s.forward_steps, len(s.model_runner.batches)
    s.interrupt.ring("chat")  # its request is on its way
    s.step()
    assert s.last_step_cut and s.stats.cut_steps == 1
    assert s.forward_steps == steps and len(s.model_runner.batches) == batches
    assert s.kv_pool.available_size() == free  # the cut step's slots went back
    # no request moved on (one it admitted keeps its place, with nothing computed yet)
    assert {r.rid: r.kv_len for r in s.running} == {r.rid: kv_lens.get(r.rid, 0) for r in s.running}
    chat = _prompt(99, 12)
    _submit(s, "chat", chat, background=False)
    s.step()
    assert not s.last_step_cut
    (first,) = s.model_runner.batches[batches:]
    assert first.extend_lens == [len(chat)]  # the chat's prefill, alone
    out = run_to_end(s)
    assert out["chat"][0] == reference_output(chat, 6)
    for rid, p in prompts.items():  # the wrong KV the cut step wrote was never read
        assert out[rid][0] == reference_output(p, 6)
    assert s.stats.cut_steps == 1


def test_a_step_with_an_interactive_row_is_not_cut():
    s = _interruptible()
    _submit(s, "line", _prompt(1), background=True)
    _submit(s, "chat", _prompt(2, 10), background=False)
    s.step()
    s.interrupt.ring("other")
    while s.has_work:
        s.step()
        if any(r.rid == "chat" for r in s.running):
            assert not s.last_step_cut
    # once "chat" finished, the line's first step alone is cut for the pending ring, and only
    # that one (a ring whose request never comes cuts one step at most)
    assert s.stats.cut_steps == 1


def test_rings_during_a_long_batch_never_change_its_outputs():
    """A ring before every third step (each followed by its request): the batch lines' outputs
    and the chats' are what each gives alone, and each ring cut at most one step."""
    s = _interruptible()
    lines = {f"line{i}": _prompt(i, 30 + 7 * i) for i in range(6)}
    for rid, p in lines.items():
        _submit(s, rid, p, background=True, n=10)
    chats: dict[str, list[int]] = {}
    tokens: dict[str, list[int]] = {}
    finished: dict[str, list[int]] = {}

    def step() -> None:
        for batch in s.step():
            for d in batch.deltas:
                toks = apply_delta(tokens.setdefault(d.rid, []), d)
                if d.finished_reason is not None:
                    finished[d.rid] = toks

    n = 0
    while s.has_work:
        if n % 3 == 0 and len(chats) < 8:
            rid = f"chat{len(chats)}"
            chats[rid] = _prompt(50 + n, 8)
            s.interrupt.ring(rid)
            step()
            _submit(s, rid, chats[rid], background=False, n=3)
        step()
        n += 1
    assert 0 < s.stats.cut_steps <= len(chats)
    for rid, p in lines.items():
        assert finished[rid] == reference_output(p, 10), rid
    for rid, p in chats.items():
        assert finished[rid] == reference_output(p, 3), rid
