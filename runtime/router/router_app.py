"""The router's HTTP app (router process): each POST is forwarded as it came to a worker the
`WorkerRegistry` picks by route and `model`, and the worker's answer is passed back as it goes
(server-sent events chunk by chunk); the router's own routes list the workers and their models.

A client that disconnects closes the forwarded request too, so the worker aborts it as it would
for a direct client. A worker that refuses the connection is marked down and the request goes to
another worker of its model; one that fails after taking the request is not retried (it may have
run), the client gets a 502.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from radixgen.errors import InvalidRequestError, RadixGenError
from radixgen.runtime.entrypoints.http_utils import (
    ApiKeyMiddleware,
    ClientDisconnected,
    error_response,
    json_response,
    loads_body,
    read_body,
    until_disconnect,
)
from radixgen.runtime.router.worker_registry import (
    NoWorkerError,
    RouteKind,
    Worker,
    WorkerRegistry,
    routing_key,
)
from radixgen.server_args import LimitsConfig

logger = logging.getLogger(__name__)

ROUTES: dict[str, RouteKind] = {
    "/generate": RouteKind.GENERATION,
    "/v1/chat/completions": RouteKind.GENERATION,
    "/v1/completions": RouteKind.GENERATION,
    "/v1/responses": RouteKind.GENERATION,
    "/v1/embeddings": RouteKind.EMBEDDING,
    "/encode": RouteKind.EMBEDDING,
    "/v1/rerank": RouteKind.EMBEDDING,
}
# request headers passed on to the worker, answer headers passed back (the rest are per hop)
FORWARD_HEADERS = ("authorization", "content-type", "accept", "x-request-id")
ANSWER_HEADERS = ("x-request-id", "retry-after", "cache-control")


@dataclass(frozen=True)
class RouterConfig:
    """The `radixgen router` flags the app needs."""

    worker_urls: tuple[str, ...]
    policy: str = "cache_aware"
    api_key: str | None = None
    health_check_interval_s: float = 10.0
    request_timeout_s: float = 1800.0
    # request bodies: the servers' default size cap and slow-body deadline (413 / 408)
    limits: LimitsConfig = field(default_factory=LimitsConfig)


class UpstreamError(RadixGenError):
    """The worker took the request and then failed it without an answer."""

    status_code = 502
    err_type = "bad_gateway"


class GatewayTimeoutError(UpstreamError):
    """The worker took the request and did not answer within `--request-timeout-secs`."""

    status_code = 504
    err_type = "gateway_timeout"


class Router:
    """The workers, one HTTP client to them, and the forwarding of one request."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.registry = WorkerRegistry(list(config.worker_urls), config.policy)
        self.auth = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # NOTE: aiohttp, not httpx: under 32 concurrent clients httpx's connection pool spent
        # ~7.5 ms of CPU a request here (it scans every connection per request); aiohttp 1.4 ms
        timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s, sock_connect=10.0)
        # an idle connection is dropped well before a worker would close it (uvicorn: 5 s by
        # default, ours 30 s): a POST on a connection the worker is closing fails unretried
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
        self.session = aiohttp.ClientSession(
            timeout=timeout,
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),  # bodies pass through as they come
        )
        await self.registry.refresh(self.session, self.auth)
        self._health_task = asyncio.create_task(self._health_loop())

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self.session is not None:
            await self.session.close()

    async def _health_loop(self) -> None:
        assert self.session is not None
        while True:
            await asyncio.sleep(self.config.health_check_interval_s)
            try:
                await self.registry.refresh(self.session, self.auth)
            except Exception:  # the loop must outlive one bad round
                logger.exception("worker discovery failed")

    async def forward(self, request: Request, kind: RouteKind) -> Response:
        """Send the request to a worker of its model and pass the answer back."""
        try:
            raw = await read_body(request, self.config.limits)
            body = loads_body(raw)
        except ClientDisconnected:
            return Response(status_code=499)  # nobody reads it
        except RadixGenError as e:
            return error_response(e)
        if not isinstance(body, dict):
            return error_response(InvalidRequestError("the body must be a JSON object"))
        model = body.get("model")
        route = request.url.path
        if model is not None and not isinstance(model, str):
            return error_response(InvalidRequestError("'model' must be a string", "model"))
        try:
            candidates = self.registry.candidates(kind, model, route)
        except RadixGenError as e:
            return error_response(e)
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARD_HEADERS}
        key = routing_key(body)
        while candidates:
            worker = self.registry.choose(candidates, key)
            try:
                return await self._send(request, worker, route, raw, headers)
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:  # not sent
                self.registry.mark_down(worker, f"{type(e).__name__}: {e}")
                candidates = [w for w in candidates if w is not worker]
                logger.warning("worker %s is down (%s); trying another", worker.url, e)
        served = f"model '{model}'" if model is not None else route
        return error_response(NoWorkerError(f"no worker serving {served} is up now"))

    async def _send(
        self, request: Request, worker: Worker, route: str, raw: bytes, headers: dict[str, str]
    ) -> Response:
        """One attempt on `worker`; its load is released when the answer is over (for a stream:
        when the relay ends)."""
        assert self.session is not None
        relay: _Relay | None = None
        upstream: aiohttp.ClientResponse | None = None
        try:
            upstream = await until_disconnect(
                request, self.session.post(worker.url + route, data=raw, headers=headers)
            )
            answer_headers = {
                k: v for k, v in upstream.headers.items() if k.lower() in ANSWER_HEADERS
            }
            media_type = upstream.headers.get("content-type", "application/json")
            if media_type.startswith("text/event-stream"):
                relay = _Relay(upstream, worker)
                return StreamingResponse(
                    relay,
                    upstream.status,
                    headers=answer_headers,
                    media_type=media_type,
                    background=BackgroundTask(relay.close),
                )
            content = await until_disconnect(request, upstream.read())
            return Response(content, upstream.status, answer_headers, media_type=media_type)
        except ClientDisconnected:  # the forwarded request was cancelled: the worker aborts it
            return Response(status_code=499)  # nobody reads it
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
            raise  # never delivered: the caller tries another worker
        except asyncio.TimeoutError as e:  # aiohttp's read timeouts are TimeoutErrors too
            return error_response(
                GatewayTimeoutError(f"worker {worker.url} did not answer in time ({e!r})")
            )
        except aiohttp.ClientError as e:
            return error_response(UpstreamError(f"worker {worker.url} failed the request: {e!r}"))
        finally:
            if relay is None:
                worker.load -= 1
                if upstream is not None:
                    upstream.close()  # read in full: back to the pool; cut short: closed


class _Relay:
    """A worker's event stream passed on chunk by chunk. Closing it (the stream ended, or the
    client left and the response was torn down) closes the worker's side, which aborts the
    request there, and releases the worker's load; closing twice does nothing."""

    def __init__(self, upstream: aiohttp.ClientResponse, worker: Worker) -> None:
        self.upstream = upstream
        self.worker = worker
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.upstream.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            # the client must see a broken stream too, not a clean end: the answer's chunked
            # body is left unterminated
            logger.warning("a relayed stream from %s broke: %r", self.worker.url, e)
            raise
        finally:
            await self.close()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.worker.load -= 1
            self.upstream.close()


def build_router_app(config: RouterConfig) -> FastAPI:
    """The router's FastAPI app (the routes in `ROUTES` forwarded, plus the router's own)."""
    router = Router(config)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await router.start()
        try:
            yield
        finally:
            await router.stop()

    app = FastAPI(title="RadixGen router", lifespan=lifespan)
    app.state.router = router

    def forwarder(kind: RouteKind) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await router.forward(request, kind)

        return endpoint

    for path, kind in ROUTES.items():
        app.add_api_route(path, forwarder(kind), methods=["POST"])

    @app.get("/health")
    async def health() -> Response:
        up = sum(w.healthy for w in router.registry.workers)
        return json_response({"healthy_workers": up}, 200 if up else 503)

    @app.get("/workers")
    async def workers() -> Response:
        listed = [w.as_dict() for w in router.registry.workers]
        return json_response({"workers": listed, "total": len(listed), "policy": config.policy})

    @app.get("/v1/models")
    async def models() -> Response:
        return json_response({"object": "list", "data": router.registry.model_cards()})

    @app.post("/flush_cache")
    async def flush_cache() -> Response:
        """Every worker that is up empties its cache (the answer lists each one's status)."""
        assert router.session is not None
        results: dict[str, int | str] = {}
        for w in router.registry.workers:
            if not w.healthy:
                continue
            try:
                async with router.session.post(w.url + "/flush_cache", headers=router.auth) as r:
                    results[w.url] = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                results[w.url] = f"{type(e).__name__}: {e}"
        ok = all(v == 200 for v in results.values())
        return json_response({"workers": results}, 200 if ok else 502)

    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    return app


def run_router(config: RouterConfig, host: str, port: int, log_level: str) -> int:
    """Serve the router until SIGINT / SIGTERM."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    app = build_router_app(config)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_keep_alive=30)
    return 0
