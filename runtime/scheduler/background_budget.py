"""How many prompt tokens batch lines may prefill in one step while interactive requests are
about (scheduler process).

A step that prefills batch lines (background work) beside interactive traffic must stay short: an
interactive request that arrives meanwhile waits for the step in flight, and on a CPU a full
512-token chunk beside a running batch takes seconds. While an interactive request runs or
arrived within INTERACTIVE_WINDOW_S, the planner gives batch lines what `--background-step-ms`
holds at the rate measured on recent steps; a batch alone keeps full chunks (the same
throughput as before: smaller steps would mean fewer lines decoding together).
"""

from __future__ import annotations

MEASURED_MIN_TOKENS = 32  # smaller steps are mostly fixed cost: they would overstate the cost
SMOOTHING = 0.25  # weight of the newest step in the moving average
MIN_BACKGROUND_TOKENS = 32  # batch lines always progress, even when decodes fill the target
INTERACTIVE_WINDOW_S = 10.0  # interactive traffic this recent keeps batch steps short


class BackgroundBudget:
    """A moving average of seconds per token (prompt tokens plus decode rows) over steps of at
    least MEASURED_MIN_TOKENS tokens, and when the last interactive request arrived."""

    def __init__(self, target_ms: float) -> None:
        self.target_ms = target_ms
        self.seconds_per_token: float | None = None
        self.last_interactive: float | None = None  # time.monotonic() of the newest arrival

    def observe_step(self, tokens: int, seconds: float) -> None:
        if tokens < MEASURED_MIN_TOKENS or seconds <= 0:
            return
        rate = seconds / tokens
        old = self.seconds_per_token
        self.seconds_per_token = rate if old is None else old + SMOOTHING * (rate - old)

    def interactive_arrived(self, now: float) -> None:
        self.last_interactive = now

    def tokens(self, decode_rows: int, interactive_running: bool, now: float) -> int | None:
        """Prompt tokens batch lines may take in a step beside `decode_rows` decodes, or None
        for no cut: no target, nothing measured yet, or no interactive request about."""
        if self.target_ms <= 0 or self.seconds_per_token is None:
            return None
        recent = self.last_interactive is not None and (
            now - self.last_interactive < INTERACTIVE_WINDOW_S
        )
        if not (interactive_running or recent):
            return None
        fit = int(self.target_ms / 1000 / self.seconds_per_token) - decode_rows
        return max(fit, MIN_BACKGROUND_TOKENS)
