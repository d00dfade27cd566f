"""The program-trace store and the `program_trace` request field, without a server: the tree built
from flat request records, the summed figures and cached share, the LRU bound, the field's checks."""

from __future__ import annotations

import itertools

import pytest

from radixgen.errors import InvalidRequestError
from radixgen.finish_reason import FinishReason
from radixgen.io_struct import RequestMeta
from radixgen.program_trace import ProgramTraceTag, parse_program_trace
from radixgen.runtime.dashboard.traces import ProgramTraceStore, phase_times
from radixgen.runtime.entrypoints.generate_request import parse_generate_request
from radixgen.runtime.request_side.req_state import ReqState

_rids = itertools.count()


def tag(node: str, kind: str = "gen", trace_id: str = "t1") -> ProgramTraceTag:
    parent = node.rpartition("#")[0]
    return ProgramTraceTag(trace_id, node, parent, kind, f"{kind} {node}", program="prog")


def send(
    store: ProgramTraceStore, t: ProgramTraceTag, prompt: int, cached: int, out: int = 4
) -> ReqState:
    st = ReqState(f"r{next(_rids)}", prompt, False, 0, False, created=0.0)
    st.trace = store.on_submit(t, st, now=100.0)
    st.meta = RequestMeta(prompt, out, cached, queue_delay=0.1, first_token_delay=0.3)
    st.finish_reason = FinishReason.length(out)
    st.finished_time = 1.0
    store.on_finish(st, now=101.0)
    return st


def test_tree_from_flat_records_follows_the_forks() -> None:
    store = ProgramTraceStore()
    send(store, tag("#0"), 20, 0)  # a gen in the program's state
    send(store, tag("#1", "prefill"), 50, 20, 0)  # the fork's shared prefix
    for branch in range(3):  # a fork at statement 1, three branches, one gen each
        send(store, tag(f"fork1/{branch}#0"), 60, 50)
    send(store, tag("fork1/2#1", "select"), 64, 60, 0)  # a select: two requests, one node
    send(store, tag("fork1/2#1", "select"), 65, 60, 0)
    send(store, tag("#3"), 90, 70)  # after the join
    tree = store.tree("t1")
    assert tree is not None
    nodes = {n["id"]: n for n in tree["nodes"]}
    assert [n["id"] for n in tree["nodes"]][:4] == ["", "#0", "#1", "fork1"]  # depth-first
    assert nodes[""]["children"] == ["#0", "#1", "fork1", "#3"]
    assert (nodes[""]["kind"], nodes[""]["label"]) == ("program", "prog")
    assert nodes["fork1"]["kind"] == "fork" and nodes["fork1"]["parent"] == ""
    assert nodes["fork1"]["children"] == ["fork1/0", "fork1/1", "fork1/2"]
    assert nodes["fork1/1"]["kind"] == "branch" and nodes["fork1/1"]["label"] == "branch 1"
    assert nodes["fork1/2"]["children"] == ["fork1/2#0", "fork1/2#1"]
    select = nodes["fork1/2#1"]
    assert select["requests"] == 2 and select["prompt_tokens"] == 129
    assert select["cached_tokens"] == 120 and select["computed_tokens"] == 9
    assert len(select["request_list"]) == 2 and select["finish_reason"] == "length"
    branch = nodes["fork1/0"]  # a state sums its subtree
    assert (branch["prompt_tokens"], branch["cached_tokens"], branch["requests"]) == (60, 50, 1)
    fork = nodes["fork1"]
    assert fork["prompt_tokens"] == 3 * 60 + 129 and fork["cached_tokens"] == 150 + 120
    root = nodes[""]
    assert root["prompt_tokens"] == tree["prompt_tokens"] == 20 + 50 + 180 + 129 + 90
    assert root["cached_tokens"] == tree["cached_tokens"] == 20 + 150 + 120 + 70
    assert tree["cached_share"] == pytest.approx(360 / 469, abs=1e-4)
    assert tree["requests"] == 8 and tree["running"] == 0 and tree["calls"] == 7
    gen = nodes["#0"]
    assert gen["queue_s"] == pytest.approx(0.1) and gen["prefill_s"] == pytest.approx(0.2)
    assert gen["decode_s"] == pytest.approx(0.7) and gen["total_s"] == pytest.approx(1.0)
    assert gen["wall_s"] == pytest.approx(1.0)


def test_running_request_and_client_gone_counts_as_abort() -> None:
    store = ProgramTraceStore()
    st = ReqState("gone", 10, False, 0, False, created=0.0)
    st.trace = store.on_submit(tag("#0"), st)
    summary = store.summaries()[0]
    assert summary["running"] == 1 and summary["prompt_tokens"] == 10
    store.on_finish(st)  # never finished: its client left
    node = store.tree("t1")["nodes"][1]  # type: ignore[index]
    assert node["finish_reason"] == "abort" and node["running"] == 0
    store.on_finish(st)  # a second finish is a no-op
    assert store.summaries()[0]["requests"] == 1


def test_lru_bound_keeps_the_most_recently_active() -> None:
    store = ProgramTraceStore(max_traces=3, max_calls=2)
    for i in range(4):
        send(store, tag("#0", trace_id=f"t{i}"), 5, 0)
    assert [s["id"] for s in store.summaries()] == ["t3", "t2", "t1"]  # t0 evicted
    send(store, tag("#1", trace_id="t1"), 5, 0)  # t1 active again
    send(store, tag("#0", trace_id="t4"), 5, 0)  # evicts t2, the least recently active
    assert [s["id"] for s in store.summaries()] == ["t4", "t1", "t3"]
    assert store.tree("t2") is None and store.tree("t0") is None
    assert [s["id"] for s in store.summaries(limit=1)] == ["t4"]
    send(store, tag("#2", trace_id="t1"), 5, 0)  # a third call: over max_calls, counted only
    assert store.summaries()[0]["calls"] == 2 and store.summaries()[0]["dropped_calls"] == 1


def test_phase_times_add_up() -> None:
    assert phase_times(1.0, 0.2, 0.5) == pytest.approx((0.2, 0.3, 0.5))
    assert phase_times(1.0, None, None) == (0.0, 1.0, 0.0)  # prefill-only, no queue figure
    assert sum(phase_times(0.5, 0.9, 2.0)) == pytest.approx(0.5)  # clocks disagree: clamped


def test_request_field_is_checked_and_carried() -> None:
    good = {"trace_id": "abc-1", "node": "fork2/1#0", "parent": "fork2/1", "kind": "gen",
            "label": 'gen("x")', "program": "p"}  # fmt: skip
    obj = parse_generate_request({"text": ["a", "b"], "program_trace": good})
    assert obj.program_trace == ProgramTraceTag("abc-1", "fork2/1#0", "fork2/1", "gen",
                                                'gen("x")', "p")  # fmt: skip
    assert obj.item(1).program_trace == obj.program_trace  # a batch's items share the call
    assert parse_program_trace({**good, "node": "#3.1", "parent": ""}) is not None
    bad = [
        ("program_trace", "x"),
        ("program_trace.trace_id", {**good, "trace_id": "a b"}),
        ("program_trace.trace_id", {**good, "trace_id": "x" * 65}),
        ("program_trace.node", {**good, "node": "fork2/0#0"}),
        ("program_trace.node", {**good, "node": "fork2/1#x"}),
        ("program_trace.parent", {**good, "parent": "../x", "node": "../x#0"}),
        ("program_trace.kind", {**good, "kind": "embed"}),
        ("program_trace.color", {**good, "color": "red"}),
        ("program_trace.label", {**good, "label": 7}),
    ]
    for param, value in bad:
        with pytest.raises(InvalidRequestError) as e:
            parse_generate_request({"text": "a", "program_trace": value})
        assert e.value.param == param, value


def test_requests_past_the_caps_are_summed_not_listed() -> None:
    from radixgen.runtime.dashboard import traces

    store = ProgramTraceStore()
    for _ in range(traces.MAX_REQUESTS_PER_CALL + 3):  # a select over many choices
        send(store, tag("#0", "select"), 10, 4)
    (node,) = [n for n in store.tree("t1")["nodes"] if n["id"] == "#0"]  # type: ignore[index]
    assert len(node["request_list"]) == traces.MAX_REQUESTS_PER_CALL
    assert node["requests"] == traces.MAX_REQUESTS_PER_CALL + 3
    assert (
        node["prompt_tokens"] == 10 * node["requests"]
        and node["cached_tokens"] == 4 * node["requests"]
    )
