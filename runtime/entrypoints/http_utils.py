"""Shared HTTP plumbing of the API process: JSON in/out, error bodies, API-key check, disconnects.

Errors leave the server in one shape, `{"error": {"message", "type", "param", "code"}}`, with the
status code of the typed error (400 bad input, 401 auth, 408 slow body, 413 body too large,
429 queue full + Retry-After, 503 dead / loading).

Request bodies are read under the `limits` flags (size counted while reading, a deadline for the
whole body) and large ones are parsed in a worker thread, so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypedDict, TypeVar, cast

import orjson
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from radixgen.errors import (
    EngineDeadError,
    InternalError,
    InvalidRequestError,
    RadixGenError,
    RequestTimeoutError,
    RequestTooLargeError,
)
from radixgen.generate_output import GenerateOutput
from radixgen.json_types import JSONValue
from radixgen.runtime.dashboard.auth import dashboard_admits
from radixgen.server_args import LimitsConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Bodies above this are parsed and validated in a worker thread: below it the thread hop costs
# more than the parse itself.
OFF_LOOP_BODY_BYTES = 64 * 1024

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_DONE = b"data: [DONE]\n\n"
# NOTE: the only routes open without the API key: liveness probes that generate nothing and
# report nothing (load balancers poll them). Exact paths: /health_generate runs the model.
AUTH_OPEN_PATHS = frozenset({"/health", "/ping"})


class NotReadyError(RadixGenError):
    """The model is still loading: the port is up but nothing can be served yet."""

    status_code = 503
    err_type = "service_unavailable"


class ShuttingDownError(RadixGenError):
    """SIGTERM arrived: requests in flight finish, new ones are refused."""

    status_code = 503
    err_type = "service_unavailable"


class NotFoundError(RadixGenError):
    """A route's object (a file, a batch, a stored response) does not exist."""

    status_code = 404
    err_type = "not_found_error"


class ServiceBusyError(RadixGenError):
    """A resource this route needs is held elsewhere (e.g. another server's data folder)."""

    status_code = 503
    err_type = "service_unavailable"


class ClientDisconnected(Exception):
    """The client went away before the answer was ready (its request has been aborted)."""


def json_response(obj: object, status_code: int = 200) -> Response:
    """orjson-encoded response: several times faster than the stdlib encoder on large bodies."""
    return Response(orjson.dumps(obj), status_code=status_code, media_type="application/json")


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: int


class ErrorBody(TypedDict):
    """The one shape errors leave the server in."""

    error: ErrorDetail


class _StreamErrorDetail(ErrorDetail):
    retryable: bool


class StreamErrorBody(TypedDict):
    """SGLang's error event inside a stream (`retryable`: a 503)."""

    error: _StreamErrorDetail


def error_body(exc: BaseException) -> ErrorBody:
    if isinstance(exc, RadixGenError):
        status = exc.status_code
        err_type = exc.err_type
        param = getattr(exc, "param", None)
        message = str(exc.args[0]) if exc.args else err_type
    else:
        status, err_type, param, message = 500, "internal_error", None, f"internal error: {exc!r}"
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def error_response(exc: BaseException) -> Response:
    body = error_body(exc)
    response = json_response(body, body["error"]["code"])
    if isinstance(exc, RadixGenError):
        response.headers.update(exc.headers)
    return response


def stream_failure(exc: Exception) -> ErrorBody:
    """The error event's body for a stream an exception broke; a bug's traceback is logged."""
    if not isinstance(exc, RadixGenError):
        logger.error("a stream failed: %r", exc, exc_info=(type(exc), exc, exc.__traceback__))
    return error_body(exc)


def sse_event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def raise_if_failed(result: GenerateOutput | list[GenerateOutput]) -> None:
    """A request the engine refused (bad grammar, dead engine) fails the whole call."""
    for item in result if isinstance(result, list) else [result]:
        fr = item["meta_info"].get("finish_reason") or {}
        if fr.get("type") != "abort":
            continue
        if fr.get("status_code") == 400:
            raise InvalidRequestError(fr.get("message", "request rejected"), None)
        if fr.get("status_code") == 503:
            raise EngineDeadError(fr.get("message", "engine unavailable"))
        if fr.get("status_code") == 500:
            raise InternalError(fr.get("message", "internal error"))


# the aborts a stream reports as an error event (a client's own abort, 499, is a normal end)
_STREAM_ERROR_TYPES = {
    400: InvalidRequestError.err_type,
    500: InternalError.err_type,
    503: EngineDeadError.err_type,
}


def stream_error(chunk: GenerateOutput | list[GenerateOutput]) -> StreamErrorBody | None:
    """An in-stream refusal as SGLang's error event, or None for a normal chunk."""
    if isinstance(chunk, dict) and "meta_info" in chunk:
        fr = chunk["meta_info"].get("finish_reason") or {}
        if fr.get("type") == "abort" and fr.get("status_code") in _STREAM_ERROR_TYPES:
            code = fr["status_code"]
            return {
                "error": {
                    "message": fr.get("message", "request failed"),
                    "type": _STREAM_ERROR_TYPES[code],
                    "param": None,
                    "code": code,
                    "retryable": code == 503,
                }
            }
    return None


def single(result: GenerateOutput | list[GenerateOutput]) -> GenerateOutput:
    """The answer of a request of one prompt and one sample: one dict (TokenizerManager.generate
    answers a list only for a batch or n > 1)."""
    return cast(GenerateOutput, result)


async def collect(agen: AsyncIterator[T]) -> T:
    """The last item of a TokenizerManager generator (the final result when not streaming)."""
    result = None
    async for item in agen:
        result = item
    # NOTE: a generator that yielded nothing answers None, as before (none of ours does that)
    return cast(T, result)


async def read_body(request: Request, limits: LimitsConfig) -> bytes:
    """The raw body, refused (413) as soon as it is known to be over the limit: from its
    Content-Length up front, else while counting a chunked body; 408 if it arrives too slowly."""
    cap = limits.max_request_body_bytes
    too_large = RequestTooLargeError(
        f"the request body is larger than {cap} bytes (--max-request-body-bytes)", None
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise too_large

    async def counted() -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(counted(), limits.request_body_timeout)
    except ClientDisconnect:
        raise ClientDisconnected() from None
    except asyncio.TimeoutError:  # NOTE: not the builtin TimeoutError before Python 3.11
        raise RequestTimeoutError(
            f"the request body did not arrive within {limits.request_body_timeout:g} s "
            "(--request-body-timeout)",
            None,
        ) from None


def loads_body(raw: bytes) -> JSONValue:
    """A request body as JSON; an empty or malformed one is a 400 that says so."""
    if not raw:
        raise InvalidRequestError("the request body is empty; send a JSON object", None)
    try:
        value: JSONValue = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequestError(f"the request body is not valid JSON: {e}", None) from e
    return value


async def read_json(request: Request) -> JSONValue:
    """The request body as JSON; a malformed body is a 400 that says so."""
    return await read_parsed(request, lambda body: body)


async def read_parsed(request: Request, parse: Callable[[JSONValue], T]) -> T:
    """Read the body, decode its JSON and run `parse` (validation) on it; a large body is decoded
    and validated in a worker thread so that other requests (and /ping) keep being served."""
    raw = await read_body(request, request.app.state.server.args.limits)

    def work() -> T:
        return parse(loads_body(raw))

    if len(raw) > OFF_LOOP_BODY_BYTES:
        return await asyncio.to_thread(work)
    return work()


async def _wait_disconnect(request: Request) -> None:
    # NOTE: the body has been read already, so receive() only returns on disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work` unless the client disconnects first; then cancel it (which aborts the request)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except BaseException:
        pass
    raise ClientDisconnected()


async def first_and_rest(
    agen: AsyncGenerator[T, None], request: Request
) -> tuple[T, AsyncGenerator[T, None]]:
    """Pull the first item before the response starts, so bad input still gets a 4xx status."""
    first = await until_disconnect(request, agen.__anext__())
    return first, agen


async def first_chunk_or_refusal(
    agen: AsyncGenerator[GenerateOutput | list[GenerateOutput], None], request: Request
) -> tuple[GenerateOutput, AsyncGenerator[GenerateOutput, None]]:
    """Like `first_and_rest`, but a request the engine refused at once (e.g. a grammar that does
    not compile) raises, so it gets a 4xx status instead of a 200 stream holding an error.

    For a streamed request: TokenizerManager.generate streams one chunk at a time (a batch's
    chunks carry their `index`), never a list, which the returned types say."""
    first, rest = await first_and_rest(agen, request)
    try:
        raise_if_failed(first)
    except RadixGenError:
        await rest.aclose()
        raise
    return cast(GenerateOutput, first), cast("AsyncGenerator[GenerateOutput, None]", rest)


class ApiKeyMiddleware:
    """Pure-ASGI Bearer-key check (no per-request task overhead like BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        if scope["path"] in AUTH_OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        if hmac.compare_digest(given, self.expected) or dashboard_admits(scope, self.api_key):
            return await self.app(scope, receive, send)
        body = orjson.dumps(
            {
                "error": {
                    "message": "invalid or missing API key (send 'Authorization: Bearer <key>')",
                    "type": "authentication_error",
                    "param": None,
                    "code": 401,
                }
            }
        )
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
