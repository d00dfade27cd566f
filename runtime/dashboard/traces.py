"""Traced DSL program runs (API process): per trace id, each request's figures, kept flat as they
arrive, and the tree of forks and calls built from them when the dashboard asks.

The TokenizerManager records a request tagged with a `program_trace` (radixgen/program_trace.py)
at submit and fills it in at finish, from the meta_info the request ends with (cached tokens,
queue and first-token delays). Memory is bounded: the most recently active `max_traces` traces,
at most `max_calls` calls and MAX_LISTED listed requests each (later calls of a huge run are
counted, not kept; later requests summed into their call).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixgen.finish_reason import FinishReason
from radixgen.io_struct import RequestMeta
from radixgen.program_trace import ProgramTraceTag, state_segments

MAX_TRACES = 64
MAX_CALLS = 1000
MAX_REQUESTS_PER_CALL = 64  # a select over many choices: the rest are summed, not listed
MAX_LISTED = 4000  # requests listed per trace (later ones are summed into their call)
ROOT = ""


@dataclass
class RequestRecord:
    """One request of a traced call; times in seconds (wall clock for the two instants)."""

    rid: str
    submitted: float
    prompt_tokens: int
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0
    finished: float | None = None
    finish_reason: str | None = None


@dataclass
class CallNode:
    """One gen / select / prefix prefill of the program: its requests in submit order."""

    node: str
    parent: str
    kind: str
    label: str
    order: int
    requests: list[RequestRecord] = field(default_factory=list)
    unlisted: int = 0  # finished requests past MAX_REQUESTS_PER_CALL, summed into `extra`
    extra: RequestRecord = field(default_factory=lambda: RequestRecord("", 0.0, 0))


@dataclass
class ProgramTrace:
    trace_id: str
    program: str | None
    started: float
    updated: float
    calls: dict[str, CallNode] = field(default_factory=dict)
    requests: int = 0
    running: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    dropped_calls: int = 0  # calls past MAX_CALLS: not kept
    listed: int = 0  # requests kept in their call's `requests`

    def summary(self) -> dict[str, object]:
        return {
            "id": self.trace_id,
            "program": self.program,
            "started": self.started,
            "updated": self.updated,
            "requests": self.requests,
            "running": self.running,
            "calls": len(self.calls),
            "dropped_calls": self.dropped_calls,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "computed_tokens": self.prompt_tokens - self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_share": _share(self.cached_tokens, self.prompt_tokens),
        }


def phase_times(
    total_s: float, queue_delay: float | None, first_token_delay: float | None
) -> tuple[float, float, float]:
    """(queue, prefill, decode) seconds that add up to `total_s`: queued until admitted, prefill
    until the first token (or the end, for a prefill-only request), decode after it."""
    queue = min(max(0.0, queue_delay or 0.0), total_s)
    first = total_s if first_token_delay is None else min(max(queue, first_token_delay), total_s)
    return queue, first - queue, total_s - first


@dataclass(frozen=True)
class PendingRequest:
    """What the TokenizerManager keeps of a traced request until it finishes."""

    trace: ProgramTrace
    call: CallNode
    rec: RequestRecord
    listed: bool


class TracedReq(Protocol):
    """What the store reads of a request's state (the TokenizerManager's `ReqState`)."""

    rid: str
    prompt_tokens: int
    created: float  # perf_counter
    finished_time: float | None
    meta: RequestMeta | None
    finish_reason: FinishReason | None
    trace: PendingRequest | None


class ProgramTraceStore:
    """The recent traces of one API process (touched on its event loop only)."""

    def __init__(self, max_traces: int = MAX_TRACES, max_calls: int = MAX_CALLS) -> None:
        self.max_traces = max_traces
        self.max_calls = max_calls
        self.traces: OrderedDict[str, ProgramTrace] = OrderedDict()
        self._order = 0

    def on_submit(
        self, tag: ProgramTraceTag | None, st: TracedReq, now: float | None = None
    ) -> PendingRequest | None:
        """Record a request as sent; the record to finish later (None when not kept)."""
        if tag is None:
            return None
        now = time.time() if now is None else now
        trace = self.traces.get(tag.trace_id)
        if trace is None:
            trace = self.traces[tag.trace_id] = ProgramTrace(tag.trace_id, tag.program, now, now)
            while len(self.traces) > self.max_traces:
                self.traces.popitem(last=False)  # the least recently active
        self.traces.move_to_end(tag.trace_id)
        trace.updated = now
        call = trace.calls.get(tag.node)
        if call is None:
            if len(trace.calls) >= self.max_calls:
                trace.dropped_calls += 1
                return None
            self._order += 1
            call = CallNode(tag.node, tag.parent, tag.kind, tag.label, self._order)
            trace.calls[tag.node] = call
        rec = RequestRecord(st.rid, now, st.prompt_tokens)
        # NOTE: memory is bounded by these caps, whatever the clients send
        listed = len(call.requests) < MAX_REQUESTS_PER_CALL and trace.listed < MAX_LISTED
        if listed:
            call.requests.append(rec)
            trace.listed += 1
        trace.requests += 1
        trace.running += 1
        trace.prompt_tokens += st.prompt_tokens
        return PendingRequest(trace, call, rec, listed)

    def on_finish(self, st: TracedReq, now: float | None = None) -> None:
        """Fill in a traced request's figures from what it finished with (one unfinished, whose
        client left, counts as aborted; a request of an evicted trace changes nothing seen)."""
        pending, meta, reason = st.trace, st.meta, st.finish_reason
        if pending is None:
            return
        st.trace = None
        total_s = (st.finished_time or time.perf_counter()) - st.created
        trace, call, rec = pending.trace, pending.call, pending.rec
        if meta is not None:
            rec.cached_tokens, rec.completion_tokens = meta.cached_tokens, meta.completion_tokens
        rec.total_s = max(0.0, total_s)
        rec.queue_s, rec.prefill_s, rec.decode_s = phase_times(
            rec.total_s,
            meta.queue_delay if meta else None,
            meta.first_token_delay if meta else None,
        )
        rec.finished = time.time() if now is None else now
        rec.finish_reason = reason.kind if reason is not None else "abort"
        trace.running -= 1
        trace.cached_tokens += rec.cached_tokens
        trace.completion_tokens += rec.completion_tokens
        trace.updated = rec.finished
        if not pending.listed:
            call.unlisted += 1
            _add(call.extra, rec)

    def summaries(self, limit: int = MAX_TRACES) -> list[dict[str, object]]:
        """The most recently active traces first."""
        out: list[dict[str, object]] = []
        for trace in reversed(self.traces.values()):
            if len(out) >= limit:
                break
            out.append(trace.summary())
        return out

    def tree(self, trace_id: str) -> dict[str, object] | None:
        trace = self.traces.get(trace_id)
        if trace is None:
            return None
        return {**trace.summary(), "nodes": build_tree(trace)}


def _add(into: RequestRecord, rec: RequestRecord) -> None:
    into.prompt_tokens += rec.prompt_tokens
    into.cached_tokens += rec.cached_tokens
    into.completion_tokens += rec.completion_tokens
    into.queue_s += rec.queue_s
    into.prefill_s += rec.prefill_s
    into.decode_s += rec.decode_s
    into.total_s += rec.total_s


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def state_label(path: str, program: str | None) -> tuple[str, str]:
    """(kind, label) of a program state from its path's last segment."""
    if path == ROOT:
        return "program", program or "program"
    last = state_segments(path)[-1]
    if last.startswith("fork"):
        return "fork", f"fork at statement {last[4:]}"
    if last.startswith("item"):
        return "item", f"batch item {last[4:]}"
    return "branch", f"branch {last}"


def build_tree(trace: ProgramTrace) -> list[dict[str, Any]]:
    """The trace's nodes depth-first from the root: program states (the program, forks, their
    branches, batch items) made from the calls' paths, and the calls; each with its children's
    ids and figures (a state's are its subtree's)."""
    nodes: dict[str, dict[str, Any]] = {}

    def state(path: str) -> dict[str, Any]:
        if path not in nodes:
            parent = None if path == ROOT else path.rpartition("/")[0]
            kind, label = state_label(path, trace.program)
            nodes[path] = _node(path, parent, kind, label)
            if parent is not None:
                state(parent)["children"].append(path)
        return nodes[path]

    state(ROOT)
    for call in sorted(trace.calls.values(), key=lambda c: c.order):
        view = _node(call.node, call.parent, call.kind, call.label)
        for rec in [*call.requests, call.extra]:
            _count(view, rec)
        view["requests"] = len(call.requests) + call.unlisted
        view["request_list"] = [rec.__dict__ for rec in call.requests]
        nodes[call.node] = view
        state(call.parent)["children"].append(call.node)
    ordered: list[dict[str, Any]] = []

    def walk(node_id: str) -> dict[str, Any]:
        view = nodes[node_id]
        ordered.append(view)
        # branches (and batch items) run at once and start in any order: list them by index,
        # in the places they first took among their siblings
        kids = view["children"]
        spots = [i for i, c in enumerate(kids) if nodes[c]["kind"] in ("branch", "item")]
        for i, c in zip(spots, sorted((kids[i] for i in spots), key=_index), strict=True):
            kids[i] = c
        for child in kids:
            sub = walk(child)
            if view["kind"] in ("program", "fork", "branch", "item"):
                _merge(view, sub)
        view["cached_share"] = _share(view["cached_tokens"], view["prompt_tokens"])
        view["computed_tokens"] = view["prompt_tokens"] - view["cached_tokens"]
        start, end = view["start"], view["end"]
        view["wall_s"] = end - start if start is not None and end is not None else None
        return view

    walk(ROOT)
    return ordered


def _index(path: str) -> int:
    return int(state_segments(path)[-1].removeprefix("item"))


_SUMS = ("requests", "running", "prompt_tokens", "cached_tokens", "completion_tokens",
         "queue_s", "prefill_s", "decode_s", "total_s")  # fmt: skip


def _node(node_id: str, parent: str | None, kind: str, label: str) -> dict[str, Any]:
    view: dict[str, Any] = {"id": node_id, "parent": parent, "kind": kind, "label": label}
    view.update(dict.fromkeys(_SUMS, 0))
    view.update({"start": None, "end": None, "finish_reason": None, "children": []})
    return view


def _count(view: dict[str, Any], rec: RequestRecord) -> None:
    view["prompt_tokens"] += rec.prompt_tokens
    view["cached_tokens"] += rec.cached_tokens
    view["completion_tokens"] += rec.completion_tokens
    for key in ("queue_s", "prefill_s", "decode_s", "total_s"):
        view[key] += getattr(rec, key)
    if rec.rid:  # not the unlisted requests' sum
        view["running"] += rec.finished is None
        view["start"] = (
            rec.submitted if view["start"] is None else min(view["start"], rec.submitted)
        )
        if rec.finished is not None:
            view["end"] = rec.finished if view["end"] is None else max(view["end"], rec.finished)
        if rec.finish_reason is not None and view["finish_reason"] != "abort":
            view["finish_reason"] = rec.finish_reason


def _merge(view: dict[str, Any], sub: dict[str, Any]) -> None:
    for key in _SUMS:
        view[key] += sub[key]
    for key, pick in (("start", min), ("end", max)):
        if sub[key] is not None:
            view[key] = sub[key] if view[key] is None else pick(view[key], sub[key])
