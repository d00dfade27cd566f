"""Typed errors for user input and engine state; the HTTP layer maps them to status codes.

Imported by every process; no heavy imports.
"""

from __future__ import annotations


class RadixGenError(Exception):
    """Base of all RadixGen errors."""

    status_code: int = 500
    err_type: str = "internal_error"


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


class QueueFullError(RadixGenError):
    """The admission queue is at `max_queued_requests`."""

    status_code = 503
    err_type = "server_overloaded"


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
