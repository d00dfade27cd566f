"""The model router's forwarding (`runtime/router/router_app.py`) in one event loop, in front of
a small aiohttp worker that can misbehave as a real one rarely does on demand: a stream that
breaks mid-way, a port nobody listens on. What must hold: the client sees a broken stream as
broken, a refused connection goes to another worker of the model, and every worker's load is
back to 0 after each answer (normal, streamed, broken, refused)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import uvicorn
from aiohttp import web

from radixgen.runtime.router.router_app import RouterConfig, build_router_app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_app() -> web.Application:
    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def model_info(_request: web.Request) -> web.Response:
        return web.json_response({"is_generation": True})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"echo": body["prompt"]})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(f'data: {{"i": {i}}}\n\n'.encode())
        if body["prompt"] == "break":
            assert request.transport is not None
            request.transport.close()  # dies mid-stream: no terminating chunk
            return resp
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/model_info", model_info)
    app.router.add_post("/v1/completions", completions)
    return app


async def _scenario() -> dict[str, object]:
    runner = web.AppRunner(_worker_app())
    await runner.setup()
    worker_port, dead_port, router_port = _free_port(), _free_port(), _free_port()
    await web.TCPSite(runner, "127.0.0.1", worker_port).start()
    live, dead = f"http://127.0.0.1:{worker_port}", f"http://127.0.0.1:{dead_port}"
    config = RouterConfig(worker_urls=(dead, live), policy="round_robin")
    app = build_router_app(config)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=router_port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    registry = app.state.router.registry
    dead_worker, live_worker = registry.workers
    out: dict[str, object] = {"live_found": live_worker.healthy, "dead_found": dead_worker.healthy}
    # pretend the dead worker answered discovery once: its refused connection must be retried
    dead_worker.model_ids, dead_worker.is_generation, dead_worker.healthy = ("m",), True, True
    url = f"http://127.0.0.1:{router_port}/v1/completions"
    try:
        async with aiohttp.ClientSession() as client:
            async with client.post(url, json={"model": "m", "prompt": "hi"}) as r:
                out["plain"] = (r.status, await r.json())
            out["dead_after"] = dead_worker.healthy
            out["load_after_plain"] = (dead_worker.load, live_worker.load)
            async with client.post(url, json={"prompt": "ok", "stream": True}) as r:
                out["stream"] = (r.status, (await r.read()).decode())
            out["load_after_stream"] = live_worker.load
            try:
                async with client.post(url, json={"prompt": "break", "stream": True}) as r:
                    await r.read()
                out["broken"] = "read to the end"
            except aiohttp.ClientPayloadError:
                out["broken"] = "payload error"
            await asyncio.sleep(0.2)  # the relay's close runs after the response
            out["load_after_break"] = live_worker.load
            async with client.post(url, json={"model": 3, "prompt": "x"}) as r:
                out["bad_model"] = r.status
            async with client.post(url, data=b"") as r:
                out["empty"] = (r.status, (await r.json())["error"]["message"])
            async with client.post(url, data=b"x" * (8 * 1024 * 1024 + 1)) as r:
                out["too_large"] = r.status
    finally:
        server.should_exit = True
        await serving
        await runner.cleanup()
    return out


def test_forwarding_retries_relays_and_releases_every_load():
    out = asyncio.run(_scenario())
    assert out["live_found"] and not out["dead_found"]  # discovery: one answered, one refused
    assert out["plain"] == (200, {"echo": "hi"})  # the refused connection went to the live one
    assert out["dead_after"] is False  # and the refusing worker is down now
    assert out["load_after_plain"] == (0, 0)
    status, text = out["stream"]
    assert status == 200 and text.count("data: ") == 4 and text.endswith("data: [DONE]\n\n")
    assert out["load_after_stream"] == 0
    assert out["broken"] == "payload error"  # a worker's broken stream is not a clean end
    assert out["load_after_break"] == 0
    assert out["bad_model"] == 400
    assert out["empty"] == (400, "the request body is empty; send a JSON object")
    assert out["too_large"] == 413  # the servers' default body cap, before forwarding anything
