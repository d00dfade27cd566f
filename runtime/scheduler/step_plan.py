"""The plan of one forward step: which requests run how many tokens, with which drafts (scheduler
process).

The planner returns a frozen `StepPlan`; the executor launches it (`step_executor.py`) and the
result processor commits its results (`result_processor.py`). Everything a step needs beyond a
request's own state travels in the plan, so the request keeps request state only and a step's
rows are never changed after planning (the plan is frozen shallowly: the launch records the KV
slots and spare rows of each draft tree's branches in its `StepDraft`). The plan is stored by column (tuples built in one pass
each): at batch 256 a plan is made every step, and an object per row would cost more than the
rest of planning a decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.speculative.draft_tree import StepDraft


class StepRow(NamedTuple):
    """One row of a plan: request `req` runs positions [start, start + extend_len) of its
    sequence (its draft's main chain last, when it has a draft)."""

    req: Req  # the owner of the row and of the KV slots its tokens get
    start: int  # the request's kv_len when the step was planned
    extend_len: int
    draft: StepDraft | None = None

    @property
    def draft_len(self) -> int:
        """Draft tokens run as this request's own extend (its tree's main chain)."""
        return draft_len(self.draft)

    @property
    def is_decode(self) -> bool:
        """One real token (a decode, drafts aside)."""
        return self.extend_len - self.draft_len == 1


def draft_len(draft: StepDraft | None) -> int:
    return len(draft.chains[0]) if draft is not None and draft.chains else 0


@dataclass(frozen=True)
class StepPlan:
    """The rows of one step, in batch order, by column."""

    reqs: tuple[Req, ...]  # the owner of each row
    starts: tuple[int, ...]  # where each row's tokens start (its request's kv_len at planning)
    extend_lens: tuple[int, ...]  # tokens each row runs, its draft's main chain included
    drafts: tuple[StepDraft | None, ...] | None = None  # None: no row carries a draft

    @classmethod
    def of(
        cls, rows: list[tuple[Req, int]], drafts: list[StepDraft | None] | None = None
    ) -> StepPlan:
        """The plan of (request, tokens) rows planned at the requests' current `kv_len`, with
        each row's draft (its main chain added to the row's tokens)."""
        reqs, lens = zip(*rows, strict=True) if rows else ((), ())
        starts = tuple([r.kv_len for r in reqs])
        if drafts is None or all(d is None for d in drafts):
            return cls(reqs, starts, lens)
        lens = tuple(n + draft_len(d) for (_, n), d in zip(rows, drafts, strict=True))
        return cls(reqs, starts, lens, tuple(drafts))

    @property
    def rows(self) -> list[StepRow]:
        drafts = self.drafts or (None,) * len(self.reqs)
        return [
            StepRow(*row)
            for row in zip(self.reqs, self.starts, self.extend_lens, drafts, strict=True)
        ]

    @property
    def drafted_rows(self) -> list[StepRow]:
        return [row for row in self.rows if row.draft is not None] if self.drafts else []

    @property
    def tokens(self) -> int:
        """Tokens the step runs (drafts included)."""
        return sum(self.extend_lens)

    @property
    def scheduled_tokens(self) -> int:
        """Tokens the step runs for its requests' sequences (drafts not counted): the step
        rate's measure."""
        if self.drafts is None:
            return sum(self.extend_lens)
        return sum(n - draft_len(d) for n, d in zip(self.extend_lens, self.drafts, strict=True))

    @property
    def drafted(self) -> bool:
        return self.drafts is not None

    def __bool__(self) -> bool:
        return bool(self.reqs)

    def __len__(self) -> int:
        return len(self.reqs)


EMPTY_PLAN = StepPlan((), (), ())
