"""Watch a Scheduler's steps in tests (no model, no processes)."""

from __future__ import annotations

from radixgen.runtime.scheduler.scheduler import Scheduler


def count_steps_in_flight(s: Scheduler) -> list[bool]:
    """Wrap `s.step` to record, after each step, whether a step was left in flight (overlap)."""
    seen: list[bool] = []
    real_step = s.step

    def step():
        out = real_step()
        seen.append(s.inflight is not None)
        return out

    s.step = step
    return seen
