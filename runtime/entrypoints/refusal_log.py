"""One log line per refused request, and an `x-request-id` on every answer (API process).

An operator whose client failed needs to know why from the server's log alone: every answer with
status >= 400 logs its status, method, route, request id and the reason returned to the client
(the error body's message). The id is the client's `x-request-id` header when it sent one, else a
fresh one; every answer carries it back (as OpenAI's API does; the openai SDK exposes it as
`_request_id`). Health probes are not logged: a load balancer polls them while the model loads.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

import orjson
from starlette.types import Message, Receive, Scope, Send

logger = logging.getLogger("radixgen.refusals")


REASON_BYTES = 4096  # the error body read for the reason; longer bodies are cut
QUIET_PATHS = frozenset({"/health", "/health_generate", "/ping"})


class RefusalLogMiddleware:
    """Pure ASGI (no per-request task); outermost, so it also sees the API key's 401s."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = _header(scope, b"x-request-id") or uuid.uuid4().hex
        status = 0
        body = bytearray()

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid.encode())]
            elif message["type"] == "http.response.body" and status >= 400:
                room = REASON_BYTES - len(body)
                if room > 0:
                    body.extend(message.get("body", b"")[:room])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if status >= 400 and scope.get("path") not in QUIET_PATHS:
                log_refusal(
                    status, scope.get("method", ""), scope.get("path", ""), rid, bytes(body)
                )


def log_refusal(status: int, method: str, path: str, rid: str, body: bytes) -> None:
    level = logging.ERROR if status >= 500 else logging.WARNING
    if status == 499:  # the client left: nothing to fix on either side
        level = logging.INFO
    logger.log(level, "refused %d %s %s request_id=%s: %s", status, method, path, rid, reason(body))


def reason(body: bytes) -> str:
    """The message a client was given: OpenAI's / SGLang's `error.message`, else the body."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip() or "(no body)"
    if isinstance(parsed, dict):
        err = parsed.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(parsed.get("detail"), str):
            return str(parsed["detail"])
    return body.decode("utf-8", "replace")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            text = value.decode("latin-1").strip()
            return text[:128] if text else None  # a client's id, kept short in the log
    return None
