"""Why a request stopped: one typed value from the scheduler to the API, SGLang's dict at the edge.

The scheduler, the detokenizer and the tokenizer manager pass `FinishReason` objects (pickled
between our own processes); only `to_dict()` spells SGLang's `meta_info.finish_reason` shape:
`{"type": "stop", "matched": str | int}` (a stop string, token id or stop_regex pattern),
`{"type": "length", "length": N}`, `{"type": "abort", "message": str, "status_code": int}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict

FinishKind = Literal["stop", "length", "abort"]


class FinishReasonDict(TypedDict, total=False):
    """SGLang's `meta_info.finish_reason`: `type`, then `matched` (stop), `length` (length), or
    `message` and `status_code` (abort)."""

    type: FinishKind
    matched: int | str | None
    length: int
    message: str
    status_code: int


@dataclass(frozen=True, slots=True)
class FinishReason:
    """Build with `FinishReason.stop(matched)`, `.length(n)` or `.abort(message, status)`."""

    kind: FinishKind
    matched: int | str | None = None  # stop: the token id, stop string or stop_regex pattern
    by_regex: bool = False  # stop: `matched` is a stop_regex pattern
    num_tokens: int = 0  # length: the limit that was reached
    message: str = ""  # abort: why, for the client
    status_code: int = 0  # abort: the HTTP status the API answers with

    @classmethod
    def stop(cls, matched: int | str) -> FinishReason:
        return cls("stop", matched=matched)

    @classmethod
    def stop_regex(cls, pattern: str) -> FinishReason:
        """Stopped by a stop_regex match; SGLang reports the pattern (not the text) as matched."""
        return cls("stop", matched=pattern, by_regex=True)

    @classmethod
    def length(cls, n: int) -> FinishReason:
        return cls("length", num_tokens=n)

    @classmethod
    def abort(cls, message: str, status_code: int) -> FinishReason:
        return cls("abort", message=message, status_code=status_code)

    @property
    def is_abort(self) -> bool:
        return self.kind == "abort"

    @property
    def matched_stop_string(self) -> str | None:
        """The stop string that ended the request (the detokenizer trims it from the text)."""
        if self.kind == "stop" and isinstance(self.matched, str) and not self.by_regex:
            return self.matched
        return None

    @property
    def matched_stop_regex(self) -> str | None:
        """The stop_regex pattern that ended the request (the detokenizer trims its match)."""
        return self.matched if self.by_regex and isinstance(self.matched, str) else None

    @property
    def matched_token_id(self) -> int | None:
        """The EOS / stop token id that ended the request, if one did."""
        return self.matched if self.kind == "stop" and isinstance(self.matched, int) else None

    def to_dict(self) -> FinishReasonDict:
        """SGLang's `finish_reason` dict (the only place that shape is written)."""
        if self.kind == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.kind == "length":
            return {"type": "length", "length": self.num_tokens}
        return {"type": "abort", "message": self.message, "status_code": self.status_code}
