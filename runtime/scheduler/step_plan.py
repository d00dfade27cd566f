"""The plan of one forward step: which requests run how many tokens, with which drafts (scheduler
process).

The planner returns a frozen `StepPlan`; the executor launches it (`step_executor.py`) and the
result processor commits its results (`result_processor.py`). Everything a step needs beyond a
request's own state travels in the plan, so the request keeps request state only and a step's
rows are never changed after planning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.speculative.draft_tree import StepDraft


@dataclass(frozen=True, slots=True)
class StepRow:
    """One request's part of a step: it runs positions [start, start + extend_len) of its
    sequence (its draft's main chain last, when it has a draft)."""

    req: Req  # the owner of the row and of the KV slots its tokens get
    start: int  # the request's kv_len when the step was planned
    extend_len: int
    draft: StepDraft | None = None

    @property
    def draft_len(self) -> int:
        """Draft tokens run as this request's own extend (its tree's main chain)."""
        return len(self.draft.chains[0]) if self.draft is not None and self.draft.chains else 0

    @property
    def is_decode(self) -> bool:
        """One real token (a decode, drafts aside)."""
        return self.extend_len - self.draft_len == 1

    @property
    def prompt_chunk(self) -> bool:
        """It runs part of its prompt: the prompt (chunk) is cached for later requests."""
        return self.extend_len > 1 and self.start < len(self.req.origin_input_ids)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """The rows of one step, in batch order."""

    rows: tuple[StepRow, ...]

    @property
    def reqs(self) -> list[Req]:
        return [row.req for row in self.rows]

    @property
    def tokens(self) -> int:
        """Tokens the step runs (drafts included): the step rate's measure."""
        return sum(row.extend_len for row in self.rows)

    @property
    def scheduled_tokens(self) -> int:
        """Tokens the step runs for its requests' sequences (drafts not counted)."""
        return sum(row.extend_len - row.draft_len for row in self.rows)

    @property
    def drafted(self) -> bool:
        return any(row.draft is not None for row in self.rows)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


EMPTY_PLAN = StepPlan(())
