"""Wait for the state a test needs by polling it, instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float, interval: float = 0.05, what: str = "the state"
) -> T:
    """Call `predicate` every `interval` seconds until it returns a truthy value, and return that.

    Fails (AssertionError naming `what` and the last value) once `timeout` seconds have passed;
    the predicate is always evaluated at or after the deadline before giving up.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what} (last: {value!r})"
            )
        time.sleep(interval)
