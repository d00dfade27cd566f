"""Priority scheduling on a real Engine: with the running batch full, a high-priority request
preempts a low one and finishes first, ahead of earlier low-priority requests still waiting;
with priorities off, an interactive request does the same to batch lines."""

from __future__ import annotations

import asyncio

import pytest

import radixgen
from radixgen.io_struct import GenerateReqInput

pytestmark = pytest.mark.slow  # starts an Engine

PROMPT = "List the days of the week, one per line, starting with Monday. Request "
LOW_TOKENS = 64  # far more decode steps than the high request needs to prefill and finish


async def _race(engine, background: bool = False) -> tuple[list[str], dict[str, dict]]:
    """Four low requests fill the batch and its queue; the high one is sent only once low0 has
    streamed its first token, so it always meets a full running batch, whatever the CPU's speed."""
    order: list[str] = []
    metas: dict[str, dict] = {}
    low0_decoding = asyncio.Event()

    async def one(rid: str, priority: int, n: int) -> None:
        sp = {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
        if rid == "high":  # through the public API, as a user sends it
            await low0_decoding.wait()
            out = await engine.async_generate(PROMPT + rid, sp, rid=rid, priority=priority)
            metas[rid] = out["meta_info"]
            order.append(rid)
            return
        obj = GenerateReqInput(
            text=PROMPT + rid, sampling_params=sp, rid=rid, priority=priority, stream=True
        )
        obj.background = background and rid.startswith("low")  # as the Batch API sends lines
        async for out in engine.tokenizer_manager.generate(obj):
            metas[rid] = out["meta_info"]
            if rid == "low0" and out["meta_info"]["completion_tokens"] >= 1:
                low0_decoding.set()
        order.append(rid)

    lows = [one(f"low{i}", 0, LOW_TOKENS) for i in range(4)]
    await asyncio.gather(*lows, one("high", 10, 4))
    return order, metas


def test_high_priority_request_preempts_and_finishes_first():
    with radixgen.Engine(
        max_running_requests=2,
        enable_priority_scheduling=True,
        priority_scheduling_preemption_threshold=5,
        max_total_tokens=4096,
        grammar_backend="none",
        log_level="warning",
    ) as eng:
        order, metas = eng.run(_race(eng))
        state = eng.get_server_info()["internal_states"][0]
    assert order[0] == "high", order  # FCFS would finish it last: 2 run, 2 wait before it
    assert state["retractions"] >= 1  # a running low one was preempted for it
    assert all(metas[f"low{i}"]["completion_tokens"] == LOW_TOKENS for i in range(4))


def test_interactive_request_goes_before_batch_lines_with_priorities_off():
    with radixgen.Engine(
        max_running_requests=2, max_total_tokens=4096, grammar_backend="none", log_level="warning"
    ) as eng:
        order, _ = eng.run(_race(eng, background=True))
        state = eng.get_server_info()["internal_states"][0]
    assert order[0] == "high", order  # its priority is ignored; the batch tier is not
    assert state["retractions"] >= 1
