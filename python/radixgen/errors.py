"""Typed errors for user input and engine state; the HTTP layer maps them to status codes.

Imported by every process; no heavy imports.
"""

from __future__ import annotations


class RadixGenError(Exception):
    """Base of all RadixGen errors."""

    status_code: int = 500
    err_type: str = "internal_error"

    @property
    def headers(self) -> dict[str, str]:
        """Extra HTTP response headers this error calls for (e.g. Retry-After)."""
        return {}


class InvalidRequestError(RadixGenError, ValueError):
    """Bad user input: a parameter, a prompt, a schema. `param` names the culprit."""

    status_code = 400
    err_type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class PromptTooLongError(InvalidRequestError):
    """The prompt (plus the tokens to generate) does not fit the context window."""


class GrammarError(InvalidRequestError):
    """An invalid JSON schema, regex or EBNF grammar, or a kind the backend cannot do."""


class RequestTooLargeError(InvalidRequestError):
    """The request body is over `max_request_body_bytes` (refused while it is being read)."""

    status_code = 413
    err_type = "request_too_large"


class RequestTimeoutError(InvalidRequestError):
    """The client did not send its whole body within `request_body_timeout` (slow-loris)."""

    status_code = 408
    err_type = "request_timeout"


class QueueFullError(RadixGenError):
    """The admission queue is at `max_queued_requests`: the client should retry later (429)."""

    status_code = 429
    err_type = "server_overloaded"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class EngineDeadError(RadixGenError):
    """A child process died; the engine can no longer serve."""

    status_code = 503
    err_type = "engine_dead"


class AuthenticationError(RadixGenError):
    status_code = 401
    err_type = "authentication_error"


class InternalError(RadixGenError):
    """A bug failed this request (its traceback is in the server log); the server carries on."""

    status_code = 500
    err_type = "internal_error"
