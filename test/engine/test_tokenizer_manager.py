"""The TokenizerManager's routing over real ZMQ sockets, with this test playing the scheduler.

Control replies are matched by id (not by arrival order or type), a reply nobody waits for is
dropped, and a timed-out control request leaves no waiter; an abort that reaches the manager
before its request is submitted still ends that request, without it ever reaching the scheduler.
"""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from radixgen.internal_state import EmbeddingSchedulerState
from radixgen.io_struct import (
    AbortReq,
    FlushCacheOut,
    FlushCacheReq,
    GenerateReqInput,
    GetInternalStateOut,
    GetInternalStateReq,
    SchedulerReadyOut,
    TokenizedGenerateReq,
)
from radixgen.runtime.launch.process_utils import PortArgs
from radixgen.runtime.request_side.tokenizer_manager import TokenizerManager
from radixgen.server_args import ServerArgs

READY = SchedulerReadyOut(
    max_total_num_tokens=4096,
    max_req_input_len=2047,
    context_length=2048,
    vocab_size=49152,
    num_threads=1,
    startup_seconds=0.0,
    dtype="float32",
)


class FakeSchedulerSockets:
    """The scheduler's ends of the manager's sockets (real ZMQ over ipc://)."""

    def __init__(self, ports: PortArgs) -> None:
        self.ctx = zmq.asyncio.Context()
        self.recv = self.ctx.socket(zmq.PULL)
        self.recv.bind(ports.scheduler_input_ipc)
        self.send = self.ctx.socket(zmq.PUSH)
        self.send.connect(ports.tokenizer_ipc)

    async def next(self, timeout: float = 5.0):
        return await asyncio.wait_for(self.recv.recv_pyobj(), timeout)

    async def nothing_within(self, seconds: float) -> bool:
        return await self.recv.poll(int(seconds * 1000)) == 0

    def close(self) -> None:
        self.ctx.destroy(linger=0)


@pytest.fixture
def wiring(default_model_folder):
    ports = PortArgs.create()
    tm = TokenizerManager(ServerArgs.from_kwargs(), default_model_folder, ports, READY, "m")
    return tm, ports


def run(wiring, body) -> None:
    tm, ports = wiring

    async def main() -> None:
        sched = FakeSchedulerSockets(ports)
        tm.start()
        try:
            await body(tm, sched)
        finally:
            tm.close()
            sched.close()

    try:
        asyncio.run(main())
    finally:
        ports.remove()


def marked(n: int) -> EmbeddingSchedulerState:
    """A scheduler state told apart by `n` (the reply's content does not matter here)."""
    return EmbeddingSchedulerState(
        waiting_requests=0, forward_steps=n, embedded_requests=0, prompt_tokens=0,
        embedding_dim=8, max_input_tokens=8,
    )  # fmt: skip


def test_control_replies_are_matched_by_id_whatever_their_order(wiring):
    async def body(tm: TokenizerManager, sched: FakeSchedulerSockets) -> None:
        calls = [
            asyncio.ensure_future(tm.get_internal_state()),
            asyncio.ensure_future(tm.get_internal_state()),
            asyncio.ensure_future(tm.flush_cache()),
        ]
        reqs = [await sched.next() for _ in calls]
        assert {type(r) for r in reqs} == {GetInternalStateReq, FlushCacheReq}
        assert len({r.request_id for r in reqs}) == 3 and all(r.request_id for r in reqs)
        # a reply for nobody first, then the real ones in reverse order
        await sched.send.send_pyobj(GetInternalStateOut(marked(-1), request_id="stale"))
        for i, r in reversed(list(enumerate(reqs))):
            if isinstance(r, FlushCacheReq):
                await sched.send.send_pyobj(FlushCacheOut(True, "done", request_id=r.request_id))
            else:
                reply = GetInternalStateOut(marked(i), request_id=r.request_id)
                await sched.send.send_pyobj(reply)
        results = await asyncio.wait_for(asyncio.gather(*calls), 5)
        by_req = dict(zip((id(r) for r in reqs), results, strict=True))
        for i, r in enumerate(reqs):
            got = by_req[id(r)]
            if isinstance(r, FlushCacheReq):
                assert got.success and got.message == "done"
            else:
                assert got == marked(i)
        assert tm.link is not None and not tm.link._waiters

    run(wiring, body)


def test_a_timed_out_control_request_leaves_no_waiter_and_its_late_reply_is_dropped(wiring):
    async def body(tm: TokenizerManager, sched: FakeSchedulerSockets) -> None:
        with pytest.raises(asyncio.TimeoutError):
            await tm._control(GetInternalStateReq(), GetInternalStateOut, timeout=0.2)
        late = await sched.next()
        assert tm.link is not None and not tm.link._waiters
        await sched.send.send_pyobj(GetInternalStateOut(marked(0), request_id=late.request_id))
        nxt = asyncio.ensure_future(tm.get_internal_state())
        req = await sched.next()
        await sched.send.send_pyobj(GetInternalStateOut(marked(1), request_id=req.request_id))
        assert await asyncio.wait_for(nxt, 5) == marked(1)

    run(wiring, body)


def test_an_abort_before_submission_ends_the_request_without_reaching_the_scheduler(wiring):
    async def body(tm: TokenizerManager, sched: FakeSchedulerSockets) -> None:
        await tm.abort_request("early")
        obj = GenerateReqInput(text="Hello", rid="early", sampling_params={"max_new_tokens": 4})
        out = await asyncio.wait_for(_last(tm.generate(obj)), 5)
        assert out["meta_info"]["finish_reason"] == {
            "type": "abort",
            "message": "aborted by the client",
            "status_code": 499,
        }
        assert await sched.nothing_within(0.3), "the aborted request reached the scheduler"
        assert not tm.states
        # the abort is used up: the same rid later runs
        again = asyncio.ensure_future(_last(tm.generate(obj)))
        msg = await sched.next()
        assert isinstance(msg, TokenizedGenerateReq) and msg.rid == "early"
        await tm.abort_request("early")
        assert await sched.next() == AbortReq(rid="early")
        again.cancel()

    run(wiring, body)


def test_aborting_an_n_samples_request_before_it_arrives_ends_every_sample(wiring):
    async def body(tm: TokenizerManager, sched: FakeSchedulerSockets) -> None:
        await tm.abort_request("group")
        obj = GenerateReqInput(
            text="Hello", rid="group", sampling_params={"max_new_tokens": 4, "n": 3}
        )
        result = asyncio.ensure_future(_last(tm.generate(obj)))
        prefill = await sched.next()  # the shared prompt's prefill still runs
        tm._on_outputs(_finished(prefill.rid))
        results = await asyncio.wait_for(result, 5)
        assert [r["meta_info"]["finish_reason"]["status_code"] for r in results] == [499] * 3
        assert await sched.nothing_within(0.3), "an aborted sample reached the scheduler"

    run(wiring, body)


def test_aborting_an_n_samples_request_during_its_prompt_prefill_ends_every_sample(wiring):
    async def body(tm: TokenizerManager, sched: FakeSchedulerSockets) -> None:
        obj = GenerateReqInput(
            text="Hello", rid="group", sampling_params={"max_new_tokens": 4, "n": 3}
        )
        result = asyncio.ensure_future(_last(tm.generate(obj)))
        prefill = await sched.next()  # the shared prompt's prefill, not yet answered
        assert isinstance(prefill, TokenizedGenerateReq) and prefill.rid not in ("group",)
        await tm.abort_request("group")
        tm._on_outputs(_finished(prefill.rid))  # the prefill ends
        results = await asyncio.wait_for(result, 5)
        assert [r["meta_info"]["finish_reason"]["status_code"] for r in results] == [499] * 3
        assert await sched.nothing_within(0.3), "an aborted sample reached the scheduler"

    run(wiring, body)


async def _last(agen):
    out = None
    async for item in agen:
        out = item
    return out


def _finished(rid: str):
    from radixgen.finish_reason import FinishReason
    from radixgen.io_struct import BatchStrOut, RequestMeta, TextDelta

    return BatchStrOut([TextDelta(rid, "", [], FinishReason.length(0), RequestMeta(1, 0, 0))])


# --- streaming: every chunk carries the logprob entries of exactly the tokens it adds ----------


def _output(rid: str, text: str, tokens: list[int], total: int, finished: bool = False):
    """One detokenizer output: `tokens` added (`total` so far), each with a logprob entry."""
    from radixgen.finish_reason import FinishReason
    from radixgen.io_struct import BatchStrOut, RequestMeta, TextDelta

    lps = [(-0.25 * t, t) for t in tokens]
    reason = FinishReason.length(total) if finished else None
    return BatchStrOut(
        [TextDelta(rid, text, tokens, reason, RequestMeta(1, total, 0), 0, lps, None, None, None)]
    )


def _stream_req(rid: str) -> GenerateReqInput:
    return GenerateReqInput(
        text="Hello", rid=rid, stream=True, return_logprob=True,
        sampling_params={"max_new_tokens": 8},
    )  # fmt: skip


def _check_chunk(chunk, text: str, tokens: list[int], total: int) -> None:
    meta = chunk["meta_info"]
    assert chunk["text"] == text
    assert [tid for _, tid, _ in meta["output_token_logprobs"]] == tokens
    assert meta["completion_tokens"] == meta["output_token_logprobs_length"] == total


async def _until(predicate) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_a_textless_output_goes_out_with_the_next_chunk_and_its_logprobs(wiring):
    """Token 11's text is held back (say, a possible stop-string prefix): no chunk carries it
    alone; the next chunk carries tokens 11 and 12 and both logprob entries (the case SGLang's
    frontend loses an entry on when the two chunks reach it together)."""

    async def body(tm: TokenizerManager, sched: FakeSchedulerSockets) -> None:
        agen = tm.generate(_stream_req("s"))
        first = asyncio.ensure_future(agen.__anext__())
        await sched.next()
        tm._on_outputs(_output("s", "", [11], 1))
        await asyncio.sleep(0.1)  # the stream wakes up for it, and sends nothing
        assert not first.done()
        tm._on_outputs(_output("s", "Hi", [12], 2))
        _check_chunk(await asyncio.wait_for(first, 5), "Hi", [11, 12], 2)
        tm._on_outputs(_output("s", "!", [13], 3, finished=True))
        last = await asyncio.wait_for(agen.__anext__(), 5)
        _check_chunk(last, "Hi!", [13], 3)
        assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
        with pytest.raises(StopAsyncIteration):
            await agen.__anext__()

    run(wiring, body)


def test_outputs_that_pile_up_before_the_consumer_reads_go_out_as_one_chunk(wiring):
    async def body(tm: TokenizerManager, sched: FakeSchedulerSockets) -> None:
        agen = tm.generate(_stream_req("s"))
        first = asyncio.ensure_future(agen.__anext__())
        await sched.next()
        tm._on_outputs(_output("s", "a", [11], 1))
        tm._on_outputs(_output("s", "b", [12], 2))
        _check_chunk(await asyncio.wait_for(first, 5), "ab", [11, 12], 2)
        await agen.aclose()

    run(wiring, body)


def test_the_finish_that_arrives_while_the_consumer_holds_a_chunk_is_not_lost(wiring):
    async def body(tm: TokenizerManager, sched: FakeSchedulerSockets) -> None:
        agen = tm.generate(_stream_req("s"))
        first = asyncio.ensure_future(agen.__anext__())
        await sched.next()
        tm._on_outputs(_output("s", "a", [11], 1))
        _check_chunk(await asyncio.wait_for(first, 5), "a", [11], 1)
        # the consumer still holds chunk 1 (e.g. writing it to a slow socket): the rest arrives
        tm._on_outputs(_output("s", "b", [12], 2))
        tm._on_outputs(_output("s", "c", [13], 3, finished=True))
        last = await asyncio.wait_for(agen.__anext__(), 5)
        _check_chunk(last, "abc", [12, 13], 3)
        assert last["meta_info"]["finish_reason"] is not None
        with pytest.raises(StopAsyncIteration):
            await agen.__anext__()

    run(wiring, body)
