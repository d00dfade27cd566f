"""The API process: FastAPI on uvicorn, the TokenizerManager on uvicorn's event loop.

`run_server(args)` binds the HTTP port first (so `/health` can say 503 while the model loads),
starts the scheduler and detokenizer processes in the background, and on SIGINT / SIGTERM (or when
a child dies) stops every child before it returns. Routes: SGLang's native API (`native_api`) and
the OpenAI-compatible API (`openai.routes`), and the live dashboard (`radixgen.runtime.dashboard`,
on by default for a loopback bind).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from types import FrameType

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixgen.runtime.dashboard.hub import DashboardHub
from radixgen.runtime.entrypoints import http_utils as hu
from radixgen.runtime.entrypoints.dashboard_routes import router as dashboard_router
from radixgen.runtime.entrypoints.native_api import router as native_router
from radixgen.runtime.entrypoints.openai.routes import router as openai_router
from radixgen.runtime.entrypoints.parser_api import router as parser_router
from radixgen.runtime.entrypoints.refusal_log import RefusalLogMiddleware
from radixgen.runtime.entrypoints.server_state import ServerState
from radixgen.runtime.launch.process_utils import configure_logging
from radixgen.runtime.launch.worker_node import run_worker_node
from radixgen.server_args import ServerArgs, dashboard_enabled, resolve_api_key
from radixgen.sglang_flags import FlagNote, log_flag_notes
from radixgen.version import __version__

logger = logging.getLogger(__name__)


def create_app(state: ServerState) -> FastAPI:
    """The ASGI app; the engine starts in the lifespan, i.e. right before the port is bound."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await state.stop()

    app = FastAPI(
        title="RadixGen",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.server = state
    if state.metrics is None and state.args.http.enable_metrics:
        from radixgen.runtime.request_side.metrics import ServerMetrics

        state.metrics = ServerMetrics()
    app.include_router(native_router)
    app.include_router(openai_router)
    app.include_router(parser_router)
    if dashboard_enabled(state.args.http):
        app.state.dashboard = DashboardHub()
        app.include_router(dashboard_router)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        body = {
            "error": {
                "message": str(exc.detail),
                "type": kind,
                "param": None,
                "code": exc.status_code,
            }
        }
        return hu.json_response(body, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or None
        body = {"error": {"message": f"{param}: {err['msg']}", "type": "invalid_request_error",
                          "param": param, "code": 400}}  # fmt: skip
        return hu.json_response(body, 400)

    @app.exception_handler(hu.ClientDisconnected)
    async def client_gone(_: Request, exc: hu.ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody reads it: the client left mid-request

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> Response:
        logger.exception("unhandled error")
        return hu.error_response(exc)

    key = resolve_api_key(state.args.http)
    if key:
        app.add_middleware(hu.ApiKeyMiddleware, api_key=key)
    app.add_middleware(RefusalLogMiddleware)  # added last: outermost, it sees the key's 401s
    return app


class _Server(uvicorn.Server):
    """uvicorn's server with an exit code, settable from the engine watchdog; SIGTERM goes to
    `on_sigterm` (the drain) instead of closing the port at once."""

    exit_code = 0
    on_sigterm: Callable[[], None] | None = None

    def request_exit(self, code: int) -> None:
        self.exit_code = max(self.exit_code, code)
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self.on_sigterm is not None and not self.should_exit:
            self.on_sigterm()
            return
        super().handle_exit(sig, frame)


def run_server(args: ServerArgs, flag_notes: Sequence[FlagNote] = ()) -> int:
    """Serve until SIGINT / SIGTERM or an engine failure; returns the process exit code.
    `flag_notes`: SGLang launch flags given that have no effect here, logged once now."""
    if args.parallel.node_rank > 0:  # another machine's ranks of a multi-node group: no API
        log_flag_notes(flag_notes)
        return run_worker_node(args)
    configure_logging(args.http.log_level, "server")
    log_flag_notes(flag_notes)
    holder: dict[str, _Server] = {}
    state = ServerState(args, request_exit=lambda code: holder["server"].request_exit(code))
    app = create_app(state)
    config = uvicorn.Config(
        app,
        host=args.http.host,
        port=args.http.port,
        log_level=args.http.log_level,
        access_log=args.http.log_level == "debug",
        # after the drain (or at once on SIGINT): time for open connections to finish
        timeout_graceful_shutdown=max(1, round(args.http.graceful_shutdown_timeout)),
        timeout_keep_alive=30,
        lifespan="on",
    )
    server = _Server(config)
    holder["server"] = server
    if args.http.graceful_shutdown_timeout > 0:
        server.on_sigterm = state.request_drain
    logger.info("RadixGen %s: HTTP on http://%s:%d, loading the model", __version__,
                args.http.host, args.http.port)  # fmt: skip
    server.run()
    if not server.started and server.exit_code == 0:
        return 1  # e.g. the port was taken
    return server.exit_code
