"""Imported by the grammar compile workers' forkserver only (its preload list in
`compile_worker.worker_context`), never by the scheduler.

A worker whose start the scheduler had begun when it exited (an `Engine` closed or a server
stopped seconds after its start, while the workers were still being spawned) fails to read its
start-up data in the forked child, and the forkserver hands that error to `sys.excepthook`, which
printed a traceback per worker on the user's terminal. Those errors (the data cut short: EOF, or
a truncated pickle) are dropped here; any other error in a forked child is printed as before.
"""

from __future__ import annotations

import pickle
import sys
from types import TracebackType

_print_error = sys.excepthook


def _quiet_when_the_parent_left(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    if isinstance(value, EOFError) or (
        isinstance(value, pickle.UnpicklingError) and "truncated" in str(value)
    ):
        return
    _print_error(kind, value, tb)


sys.excepthook = _quiet_when_the_parent_left
