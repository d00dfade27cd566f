"""Program traces, client side: `run(..., trace=True)` gives the run one trace id, and every
request its states send carries its place in the run's tree (`program_trace`, whose wire format
and paths radixgen/program_trace.py defines), so the server's dashboard can show what the prefix
cache saved per fork and call.

The tag of the call being executed lives in a context variable set around the backend call, on
the state's worker thread: every request a call sends (a select's prefill and scoring, a dtype
gen's retries) carries it, without the backends passing it along.
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from radixgen.program_trace import FIELD, ProgramTraceTag

_current: contextvars.ContextVar[ProgramTraceTag | None] = contextvars.ContextVar(
    "radixgen_program_trace", default=None
)


@dataclass(frozen=True)
class TraceScope:
    """One program state's place in a traced run."""

    trace_id: str
    program: str | None
    path: str = ""  # "" the run's own state; see radixgen/program_trace.py

    @staticmethod
    def new(program: str | None) -> TraceScope:
        return TraceScope(uuid.uuid4().hex, program)

    def below(self, segment: str) -> TraceScope:
        path = f"{self.path}/{segment}" if self.path else segment
        return TraceScope(self.trace_id, self.program, path)

    def branch(self, fork_statement: int, index: int) -> TraceScope:
        """Branch `index` of the fork made by statement `fork_statement` of this state."""
        return self.below(f"fork{fork_statement}").below(str(index))

    def item(self, index: int) -> TraceScope:
        """The `index`-th program of a traced run_batch."""
        return self.below(f"item{index}")

    def tag(self, statement: int, call: int, kind: str, label: str) -> ProgramTraceTag:
        suffix = f"#{statement}" if call == 0 else f"#{statement}.{call}"
        return ProgramTraceTag(
            self.trace_id, self.path + suffix, self.path, kind, label, self.program
        )


@contextmanager
def tagged(tag: ProgramTraceTag | None) -> Iterator[None]:
    """Requests sent inside the block carry `tag` (nothing changes for None)."""
    if tag is None:
        yield
        return
    token = _current.set(tag)
    try:
        yield
    finally:
        _current.reset(token)


def with_trace(payload: dict[str, Any]) -> dict[str, Any]:
    """The /generate payload with the current call's `program_trace`, if a traced call runs."""
    tag = _current.get()
    return payload if tag is None else {**payload, FIELD: tag.to_dict()}


def call_label(kind: str, name: str | None) -> str:
    return f"{kind}({name!r})" if name is not None else f"{kind}()"
