"""Server processes start in order, stop without orphans, and exit cleanly when a child dies.

Each test starts its own `python -m radixgen.launch_server` (they signal or break it).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import openai
import psutil
import pytest
from wait_helpers import wait_until

import radixgen as rg

from .server_process import ServerProcess, server_flags, wait_gone

pytestmark = pytest.mark.slow  # starts and stops real server processes


def _role_pid(pids: list[int], role: str) -> int:
    for pid in pids:
        if role in " ".join(psutil.Process(pid).cmdline()):
            return pid
    raise AssertionError(f"no {role} child among {pids}")


def _in_flight(url: str, headers: dict | None = None) -> int:
    """Requests the scheduler holds (running or waiting)."""
    st = httpx.get(url + "/server_info", headers=headers).json()["internal_states"][0]
    return st["running_requests"] + st["waiting_requests"]


def _queue_full_429(url: str, headers: dict) -> None:
    """max_running_requests=1 + max_queued_requests=1: a third request in flight is refused."""
    body = {"text": "Story:", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    threads = [
        threading.Thread(target=httpx.post, args=(url + "/generate",),
                         kwargs={"json": {**body, "rid": f"fill-{i}"}, "headers": headers, "timeout": 60})
        for i in range(2)
    ]  # fmt: skip
    for t in threads:
        t.start()
    wait_until(lambda: _in_flight(url, headers) >= 2, 60, what="both requests to be in flight")
    r = httpx.post(url + "/generate", json=body, headers=headers, timeout=60)
    assert r.status_code == 429 and r.json()["error"]["type"] == "server_overloaded", r.text
    assert (
        r.headers["retry-after"] == "1" and "--max-queued-requests" in r.json()["error"]["message"]
    )
    httpx.post(url + "/abort_request", json={"abort_all": True}, headers=headers)
    for t in threads:
        t.join(30)


def test_health_503_until_loaded_auth_and_sigterm_leaves_no_orphans(tmp_path):
    key_file = tmp_path / "api_key"
    key_file.write_text("sekret\n")  # from a file: the key is not in the process's command line
    srv = ServerProcess(
        "--api-key-file", str(key_file), "--max-running-requests", "1",
        "--max-queued-requests", "1", *server_flags(),
    )  # fmt: skip
    try:
        seen = srv.wait_healthy()
        assert 503 in seen, f"/health should answer 503 while loading, saw {seen}"
        pids = srv.child_pids()
        assert len(pids) >= 2
        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
        assert httpx.post(srv.url + "/generate", json=body).status_code == 401
        wrong = httpx.post(srv.url + "/generate", json=body, headers={"Authorization": "Bearer no"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        ok = httpx.post(
            srv.url + "/generate", json=body, headers={"Authorization": "Bearer sekret"}
        )
        assert ok.status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 200  # probes need no key
        assert httpx.get(srv.url + "/ping").status_code == 200
        assert httpx.get(srv.url + "/health_generate").status_code == 401  # it runs the model
        assert "sekret" not in " ".join(srv.proc.args)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="no", max_retries=0).models.list()
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekret", max_retries=0)
        assert good.models.list().data

        # the DSL's native backend sends the key too
        @rg.function
        def hello(s):
            s += "Say hi:" + rg.gen("out", max_tokens=2, temperature=0)

        assert hello.run(backend=rg.RuntimeEndpoint(srv.url, api_key="sekret"))["out"] is not None
        with pytest.raises(rg.BackendError, match=r"401"):
            rg.RuntimeEndpoint(srv.url, api_key="no")
        _queue_full_429(srv.url, {"Authorization": "Bearer sekret"})
    finally:
        code = srv.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM), srv.log()
    assert not wait_gone(pids), "engine children outlived the server"


def test_sigint_while_loading_stops_children():
    srv = ServerProcess(*server_flags())
    try:
        deadline = time.monotonic() + 60
        while srv.health_status() != 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        while len(srv.child_pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the port is up first; the children follow
        pids = srv.child_pids()
        assert len(pids) >= 2 and srv.health_status() == 503, "still loading"
    finally:
        code = srv.stop(signal.SIGINT)
    assert code is not None and srv.proc.poll() is not None
    assert not wait_gone(pids), "engine children outlived the server"


def _ipc_dir(pids: list[int]) -> str:
    """The engine's IPC dir: children are started as `child_main ROLE <ipc dir>/spec.pkl`."""
    spec = psutil.Process(_role_pid(pids, "scheduler")).cmdline()[-1]
    assert spec.endswith("spec.pkl") and os.path.isdir(os.path.dirname(spec)), spec
    return os.path.dirname(spec)


def _long_request(url: str, result: dict, **extra) -> None:
    # NOTE: near the model's 8192-token context, so no machine finishes it within the tests'
    # 20 s (the quantized default decodes 3000 tokens in ~19 s on one thread here)
    body = {"text": "Story:", "sampling_params": {"max_new_tokens": 8000, "ignore_eos": True}}
    result["r"] = httpx.post(url + "/generate", json={**body, **extra}, timeout=60)


def _long_stream(url: str, result: dict, started: threading.Event, max_new_tokens=3000) -> None:
    body = {"text": "Tale:", "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}  # fmt: skip
    with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
        events = []
        for line in r.iter_lines():
            if line:
                events.append(line)
                started.set()
        result["events"] = events


@pytest.mark.parametrize("role", ["scheduler", "detokenizer"])
def test_dead_child_fails_requests_with_503_and_server_exits(role):
    """SIGKILL of a child: in-flight requests get 503 (JSON / an error event), the server exits
    non-zero within 10 s, leaving no engine process and no IPC dir."""
    srv = ServerProcess(*server_flags())
    try:
        srv.wait_healthy()
        pids = srv.child_pids()
        ipc_dir = _ipc_dir(pids)
        result: dict = {}
        stream_started = threading.Event()
        t = threading.Thread(target=_long_request, args=(srv.url, result))
        t.start()
        ts = threading.Thread(target=_long_stream, args=(srv.url, result, stream_started))
        ts.start()
        wait_until(
            lambda: stream_started.is_set() and _in_flight(srv.url) >= 2,
            60,
            what="both requests in flight, the stream's first event received",
        )
        os.kill(_role_pid(pids, role), signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(lambda: srv.health_status() != 200, 10, what="/health to fail")
        assert srv.health_status() in (503, None), "/health fails once a child is dead"
        t.join(30)
        assert result["r"].status_code == 503
        assert result["r"].json()["error"]["type"] == "engine_dead"
        ts.join(30)
        events = result["events"]
        assert events[-1] == "data: [DONE]", events[-3:]
        assert json.loads(events[-2][len("data: ") :])["error"]["code"] == 503
        srv.proc.wait(30)
        assert time.monotonic() - killed_at < 10, "the server took over 10 s to exit"
        assert srv.proc.returncode == 1, srv.log()
        assert not wait_gone(pids), "engine children outlived the server"
        assert not os.path.exists(ipc_dir), "the IPC dir was left behind"
    finally:
        srv.stop()


def test_sigterm_drains_requests_in_flight_and_refuses_new_ones():
    """SIGTERM: a request of a few dozen tokens in flight finishes; one that cannot finish within
    --graceful-shutdown-timeout gets 503 then; new requests get 503 meanwhile; exit 0, no leftovers."""
    srv = ServerProcess("--graceful-shutdown-timeout", "20", *server_flags())
    try:
        srv.wait_healthy()
        pids = srv.child_pids()
        ipc_dir = _ipc_dir(pids)
        short: dict = {}
        long: dict = {}
        stream_started = threading.Event()
        ts = threading.Thread(target=_long_stream, args=(srv.url, short, stream_started, 40))
        ts.start()
        tl = threading.Thread(target=_long_request, args=(srv.url, long))
        tl.start()
        wait_until(
            lambda: stream_started.is_set() and _in_flight(srv.url) >= 2,
            60,
            what="both requests in flight, the stream's first event received",
        )
        srv.proc.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()

        def refused() -> httpx.Response | None:
            body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
            r = httpx.post(srv.url + "/generate", json=body, timeout=10)
            return r if r.status_code == 503 else None

        r = wait_until(refused, 5, what="new requests to be refused")
        assert r.json()["error"]["type"] == "service_unavailable"
        assert "shutting down" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/health").status_code == 503
        ts.join(60)
        events = short["events"]
        assert events[-1] == "data: [DONE]", events[-3:]
        final = json.loads(events[-2][len("data: ") :])
        assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 40}, final
        tl.join(60)
        assert long["r"].status_code == 503, long["r"].text
        assert "graceful shutdown timeout" in long["r"].json()["error"]["message"]
        assert time.monotonic() - sent_at >= 19, "the long request was cut before the timeout"
        srv.proc.wait(30)
        assert srv.proc.returncode == 0, srv.log()
        assert not wait_gone(pids), "engine children outlived the server"
        assert not os.path.exists(ipc_dir), "the IPC dir was left behind"
    finally:
        srv.stop()
