"""The dashboard's HTTP routes (API process): the page, its assets, and the JSON / SSE API.

`GET /dashboard` the page; `GET /dashboard/static/<file>` its script and style (served from the
package, no CDN); `GET /dashboard/api/snapshot` one view as JSON; `GET /dashboard/api/history` the
plot points kept so far; `GET /dashboard/api/stream` the same view as server-sent events, one per
`interval` seconds while the client stays connected; `GET /dashboard/api/traces` the recent traced
program runs and `GET /dashboard/api/traces/<id>` one run's tree of forks and calls. Included only
when the dashboard is on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from radixgen.errors import EngineDeadError, RadixGenError
from radixgen.runtime.dashboard import STATIC
from radixgen.runtime.dashboard.auth import (
    DASHBOARD_COOKIE,
    DASHBOARD_PATH,
    KEY_QUERY,
    dashboard_token,
    query_key,
)
from radixgen.runtime.dashboard.hub import DashboardHub
from radixgen.runtime.dashboard.traces import MAX_TRACES, ProgramTraceStore
from radixgen.runtime.entrypoints.http_utils import (
    SSE_HEADERS,
    error_body,
    error_response,
    json_response,
    sse_event,
)
from radixgen.runtime.entrypoints.server_state import ServerState
from radixgen.server_args import resolve_api_key

logger = logging.getLogger(__name__)
router = APIRouter()

ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
DEFAULT_NODES = 200
MaxNodes = Annotated[int, Query(ge=1, le=2000, description="radix nodes to include")]
Interval = Annotated[float, Query(ge=0.2, le=60.0, description="seconds between events")]
Limit = Annotated[int, Query(ge=1, le=MAX_TRACES, description="traces to list")]


def _hub(request: Request) -> DashboardHub:
    hub: DashboardHub = request.app.state.dashboard
    return hub


async def _view(request: Request, max_nodes: int) -> dict[str, object]:
    state: ServerState = request.app.state.server
    tm = state.manager(while_draining=True)
    try:
        return await _hub(request).snapshot(tm, tm.tokenizer, max_nodes)
    except asyncio.TimeoutError as e:
        raise EngineDeadError("the scheduler did not answer the dashboard's snapshot") from e


@router.get(DASHBOARD_PATH)
async def page(request: Request) -> Response:
    state: ServerState = request.app.state.server
    key = resolve_api_key(state.args.http)
    if key and query_key(request.scope) is not None:
        # the middleware checked the key; trade it for a cookie and drop it from the address bar
        rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != KEY_QUERY])
        redirect = RedirectResponse(DASHBOARD_PATH + ("?" + rest if rest else ""), status_code=303)
        redirect.set_cookie(
            DASHBOARD_COOKIE,
            dashboard_token(key),
            path=DASHBOARD_PATH,
            httponly=True,
            samesite="strict",
        )
        return redirect
    html = await asyncio.to_thread((STATIC / "index.html").read_bytes)
    return Response(
        html, media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-store"}
    )


@router.get(DASHBOARD_PATH + "/static/{name}")
async def asset(name: str) -> Response:
    media = ASSETS.get(name)
    if media is None:
        return error_response(_NotFound(f"no dashboard asset named {name!r}"))
    body = await asyncio.to_thread((STATIC / name).read_bytes)
    return Response(body, media_type=f"{media}; charset=utf-8")


class _NotFound(RadixGenError):
    status_code = 404
    err_type = "not_found_error"


@router.get(DASHBOARD_PATH + "/api/snapshot")
async def snapshot(request: Request, max_nodes: MaxNodes = DEFAULT_NODES) -> Response:
    try:
        return json_response(await _view(request, max_nodes))
    except RadixGenError as e:
        return error_response(e)


@router.get(DASHBOARD_PATH + "/api/history")
async def history(request: Request) -> Response:
    return json_response({"history": [p.__dict__ for p in _hub(request).history]})


def _traces(request: Request) -> ProgramTraceStore:
    state: ServerState = request.app.state.server
    return state.manager(while_draining=True).program_traces


@router.get(DASHBOARD_PATH + "/api/traces")
async def traces(request: Request, limit: Limit = MAX_TRACES) -> Response:
    """Traced program runs (`run(..., trace=True)`), the most recently active first."""
    try:
        return json_response({"traces": _traces(request).summaries(limit)})
    except RadixGenError as e:
        return error_response(e)


@router.get(DASHBOARD_PATH + "/api/traces/{trace_id}")
async def trace(request: Request, trace_id: str) -> Response:
    """One traced run: its summary and `nodes`, the tree depth-first from the program's state."""
    try:
        tree = _traces(request).tree(trace_id)
        if tree is None:
            raise _NotFound(f"no program trace {trace_id!r} (unknown, or no longer kept)")
        return json_response(tree)
    except RadixGenError as e:
        return error_response(e)


@router.get(DASHBOARD_PATH + "/api/stream")
async def stream(
    request: Request, interval: Interval = 1.0, max_nodes: MaxNodes = DEFAULT_NODES
) -> Response:
    return StreamingResponse(
        _events(request, interval, max_nodes), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _events(request: Request, interval: float, max_nodes: int) -> AsyncIterator[bytes]:
    """One view per interval until the client leaves; while the engine cannot answer (loading,
    dead) an error object in the same framing, and the stream carries on."""
    loop = asyncio.get_running_loop()
    while not await request.is_disconnected():
        started = loop.time()
        try:
            yield sse_event(await _view(request, max_nodes))
        except RadixGenError as e:
            yield sse_event(error_body(e))
        except Exception as e:  # NOTE: a bug in a snapshot must not end the page's stream
            logger.exception("dashboard snapshot failed")
            yield sse_event(error_body(e))
        await asyncio.sleep(max(0.0, interval - (loop.time() - started)))
