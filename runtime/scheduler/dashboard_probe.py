"""What the live dashboard sees of the scheduler (scheduler process).

Two small rings filled as the loop runs, O(batch) per step with no allocation beyond one tuple
(recent steps' batch composition) and O(1) per finished request (its timeline), and a snapshot
built only when the API process asks for one (`DashboardSnapshotReq`, between steps).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from radixgen.io_struct import DashboardSnapshot, RadixNodeView, RequestTimeline, StepRecord
from radixgen.runtime.mem_cache.radix_cache import RadixCache
from radixgen.runtime.mem_cache.tree_snapshot import snapshot_tree

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.scheduler.scheduler import Scheduler
    from radixgen.runtime.scheduler.step_plan import StepPlan

STEP_RING = 240  # recent forward steps kept (batch composition)
FINISHED_RING = 64  # recent finished requests kept (timelines)
LIVE_REQS_MAX = 32  # running / waiting requests listed per snapshot, each
MAX_NODES_LIMIT = 2000  # the most radix nodes one snapshot may carry
PROMPT_HEAD, PROMPT_TAIL, OUTPUT_HEAD = 24, 40, 64  # token ids sent for text previews


class DashboardProbe:
    """Rings of recent steps and finished requests, and the snapshot the dashboard reads."""

    def __init__(self) -> None:
        # NOTE: a plain tuple per step (StepRecord's fields in order): the snapshot, built only
        # when asked, makes the records
        self.steps: deque[tuple[float, int, int, int, int, int, int, int, int, int]] = deque(
            maxlen=STEP_RING
        )
        self.finished: deque[RequestTimeline] = deque(maxlen=FINISHED_RING)

    def on_step(self, plan: StepPlan, sched: Scheduler) -> None:
        """One forward step was launched over `plan` (synchronous: its tokens accepted too;
        overlap: they are committed one step later)."""
        decodes = prefill_tokens = 0
        if plan.drafts is None:
            decodes = plan.extend_lens.count(1)
            prefill_tokens = plan.tokens - decodes
        else:
            for row in plan.rows:
                if row.is_decode:
                    decodes += 1
                else:
                    prefill_tokens += row.extend_len - row.draft_len
        grammar_rows = sum(1 for r in plan.reqs if r.grammar is not None)
        kv_used = sched.kv_pool.size - sched.kv_pool.available_size()
        st = sched.stats
        self.steps.append(
            (time.time(), decodes, len(plan) - decodes, prefill_tokens, grammar_rows,
             st.jump_forward_tokens, len(sched.running), len(sched.waiting), kv_used,
             st.generated_tokens)
        )  # fmt: skip

    def on_outbox(self, outbox: list[Req]) -> None:
        """Outputs are being sent: keep the timelines of the requests that finished."""
        now = time.time()
        seen: set[int] = set()
        for r in outbox:
            if r.finished and id(r) not in seen:
                seen.add(id(r))
                self.finished.append(timeline(r, "finished", now))

    def snapshot(self, sched: Scheduler, max_nodes: int) -> DashboardSnapshot:
        """Everything the dashboard shows, as plain data (token ids undecoded)."""
        t0 = time.perf_counter()
        nodes: list[RadixNodeView] = []
        truncated = False
        cache = sched.cache
        if isinstance(cache, RadixCache):
            nodes, truncated = snapshot_tree(cache, max(0, min(max_nodes, MAX_NODES_LIMIT)))
        now = time.time()
        live = [timeline(r, "running", now) for r in sched.running[:LIVE_REQS_MAX]]
        queued = [*sched.waiting, *sched.grammar_waiting][:LIVE_REQS_MAX]
        live += [timeline(r, "waiting", now) for r in queued]
        return DashboardSnapshot(
            time=now,
            build_seconds=time.perf_counter() - t0,
            state=sched.internal_state(),
            retracted_waiting=sum(1 for r in sched.waiting if r.retractions),
            radix_enabled=isinstance(cache, RadixCache),
            tree_nodes=nodes,
            tree_truncated=truncated,
            steps=[StepRecord(*s) for s in self.steps],
            requests=[*live, *reversed(self.finished)],
        )


def timeline(r: Req, state: str, now: float) -> RequestTimeline:
    """One request's timeline (wall-clock seconds) and counters."""
    reason = r.finished_reason
    first_token = (
        r.arrival_time + r.first_token_delay
        if r.first_token_delay is not None and r.arrival_time
        else None
    )
    prompt = r.origin_input_ids
    tail = prompt[PROMPT_HEAD:][-PROMPT_TAIL:]
    return RequestTimeline(
        rid=r.rid,
        state=state,
        arrival=r.arrival_time or None,
        admitted=r.admit_time,
        first_token=first_token,
        finished=now if state == "finished" else None,
        prompt_tokens=len(prompt),
        cached_tokens=r.cached_tokens,
        computed_tokens=len(prompt) - r.cached_tokens if r.admitted_once else 0,
        completion_tokens=len(r.output_ids),
        retractions=r.retractions,
        jump_forward_tokens=r.jump_forward_tokens,
        constrained=r.constrained,
        finish_reason=None if reason is None else reason.kind,
        finish_message=None if reason is None else reason.message or None,
        prompt_head_ids=list(prompt[:PROMPT_HEAD]),
        prompt_tail_ids=list(tail),
        prompt_gap=max(0, len(prompt) - PROMPT_HEAD - len(tail)),
        output_ids=list(r.output_ids[:OUTPUT_HEAD]),
        output_truncated=len(r.output_ids) > OUTPUT_HEAD,
    )
