"""Errors the DSL raises: where a program failed (its own line), and what a backend refused."""

from __future__ import annotations

from radixgen.errors import RadixGenError


class BackendError(RadixGenError, RuntimeError):
    """A backend refused or failed a request; `status` is the HTTP status when there was one.

    Subclasses RuntimeError because SGLang's RuntimeEndpoint raises RuntimeError(body).
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ProgramError(RadixGenError, RuntimeError):
    """A statement of a program failed; the message names the program's file and line.

    The original exception is chained as `__cause__` so its traceback is kept too.
    """

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
