"""`--tp-size` through the real server: the default model split over 3 rank processes (its 9 q /
3 KV heads split only in 3) serves plain, streamed, constrained and aborted requests and keeps
its ranks in step while idle; and the life cycle of a group: a rank that dies or stops answering
takes the whole server down with the reason in the log, within a bounded time, leaving no
process behind."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil
import pytest
from server.server_process import ServerProcess, running_server, server_flags, wait_gone
from wait_helpers import wait_until

from .tp_model import build_tp_model

pytestmark = pytest.mark.slow  # real servers with several rank processes

DIST_TIMEOUT_S = 5


def _ranks(server: ServerProcess) -> dict[int, psutil.Process]:
    """tp rank -> its scheduler process (`child_main scheduler SPEC [DP TP]`)."""
    out = {}
    for p in psutil.Process(server.proc.pid).children():
        cmd = p.cmdline()
        if "scheduler" in cmd:
            rest = cmd[cmd.index("scheduler") + 2 :]
            out[int(rest[1]) if len(rest) > 1 else 0] = p
    return out


@pytest.fixture(scope="module")
def tp3_server():
    with running_server(
        *server_flags(), "--tp-size", "3", "--dist-timeout", str(DIST_TIMEOUT_S),
        "--max-total-tokens", "4096",
    ) as proc:  # fmt: skip
        yield proc


@pytest.fixture(scope="module")
def http(tp3_server):
    with httpx.Client(base_url=tp3_server.url, timeout=120.0) as client:
        yield client


def test_three_ranks_serve_plain_and_streamed_requests(tp3_server, http):
    assert sorted(_ranks(tp3_server)) == [0, 1, 2]
    body = {
        "text": "The capital of France is",
        "sampling_params": {"max_new_tokens": 6, "temperature": 0},
    }
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    plain = r.json()
    assert "Paris" in plain["text"]
    chunks = []
    with http.stream("POST", "/generate", json={**body, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[len("data: ") :]))
    assert len(chunks) >= 2 and chunks[-1]["text"] == plain["text"]  # cumulative text
    assert chunks[-1]["meta_info"]["cached_tokens"] > 0  # the prompt, from rank 0's radix cache
    info = http.get("/server_info").json()
    assert info["tp_size"] == 3


def test_constrained_decoding_through_the_group(http):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    r = http.post(
        "/generate",
        json={"text": "Give me a JSON object with a name.",
              "sampling_params": {"max_new_tokens": 40, "temperature": 0,
                                  "json_schema": json.dumps(schema)}},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["text"])["name"], str)


def test_abort_stops_a_request_on_every_rank(tp3_server, http):
    done: dict = {}
    started = threading.Event()

    def stream() -> None:
        body = {"text": "Count: 1, 2,", "rid": "tp-long", "stream": True,
                "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}  # fmt: skip
        with (
            httpx.Client(timeout=120.0) as c,
            c.stream("POST", tp3_server.url + "/generate", json=body) as s,
        ):
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    done["meta"] = json.loads(line[len("data: ") :])["meta_info"]
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60)
    assert http.post("/abort_request", json={"rid": "tp-long"}).status_code == 200
    t.join(30)
    assert done["meta"]["finish_reason"]["type"] == "abort"
    state = http.get("/server_info").json()["internal_states"][0]
    wait_until(
        lambda: http.get("/server_info").json()["internal_states"][0]["running_requests"] == 0,
        10, what="the aborted request to leave the running batch",
    )  # fmt: skip
    assert state["kv_used_tokens"] >= 0
    r = http.post("/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text  # the group is still in step


def test_an_idle_group_outlives_the_collective_timeout(http):
    """Rank 0 sends an empty step every second: ranks waiting longer than --dist-timeout for
    work are not mistaken for a broken group."""
    time.sleep(DIST_TIMEOUT_S + 2)
    r = http.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return build_tp_model(tmp_path_factory.mktemp("tp-life"), seed=3)


def _tiny_tp2(folder, *extra: str) -> ServerProcess:
    srv = ServerProcess(
        *server_flags(), "--model-path", str(folder), "--tp-size", "2", "--dtype", "float32",
        "--dist-timeout", str(DIST_TIMEOUT_S), "--grammar-backend", "none", "--log-level", "info",
        *extra,
    )  # fmt: skip
    srv.wait_healthy()
    return srv


def _busy(url: str, out: dict) -> None:
    body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True},
    }
    try:
        out["r"] = httpx.post(url + "/generate", json=body, timeout=120)
    except httpx.TransportError as e:
        out["r"] = e


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_rank_that_dies_or_hangs_takes_the_server_down(tiny_folder, how):
    """SIGKILL of rank 1: rank 0's next collective fails at once. SIGSTOP of rank 1: it is
    alive but out of step, and rank 0's collective gives up after --dist-timeout. Either way the
    server exits non-zero within a bounded time, says why, and leaves no process behind."""
    srv = _tiny_tp2(tiny_folder)
    try:
        pids = srv.child_pids()
        ranks = _ranks(srv)
        out: dict = {}
        t = threading.Thread(target=_busy, args=(srv.url, out))
        t.start()
        wait_until(
            lambda: httpx.get(srv.url + "/server_info").json()["internal_states"][0]["forward_steps"] > 2,
            60, what="the request to be decoding",
        )  # fmt: skip
        os.kill(ranks[1].pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        hit = time.monotonic()
        srv.proc.wait(DIST_TIMEOUT_S + 20)
        took = time.monotonic() - hit
        assert srv.proc.returncode == 1, srv.log()
        log = srv.log()
        assert "engine is dead" in log
        if how == "stopped":
            assert "tensor-parallel rank 0/2" in log and "--dist-timeout 5 s" in log, log
            assert took >= DIST_TIMEOUT_S - 1
        assert took < DIST_TIMEOUT_S + 20
        t.join(30)
        assert not wait_gone(pids), "rank processes outlived the server"
    finally:
        srv.stop()


def test_two_nodes_on_one_host_serve_one_tp_group(tiny_folder):
    """--nnodes 2: node 0 runs the API, the detokenizer and rank 0; node 1 only rank 1 (and
    /health). They meet at --dist-init-addr over TCP; the tokens are those of one process; a
    SIGTERM on node 0 stops node 1 too, within 10 s."""
    from server.server_process import free_port

    import radixgen as rg

    ids = [11, 12, 13, 14, 15]
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with rg.Engine(model_path=str(tiny_folder), dtype="float32", num_threads=1,
                   grammar_backend="none", log_level="warning") as engine:  # fmt: skip
        expected = engine.generate(input_ids=ids, sampling_params=params)["output_ids"]
    addr = f"127.0.0.1:{free_port()}"
    common = [*server_flags(), "--model-path", str(tiny_folder), "--tp-size", "2",
              "--dtype", "float32", "--grammar-backend", "none", "--nnodes", "2",
              "--dist-init-addr", addr, "--log-level", "info"]  # fmt: skip
    node1 = ServerProcess(*common, "--node-rank", "1")
    node0 = ServerProcess(*common, "--node-rank", "0")
    try:
        node0.wait_healthy()
        node1.wait_healthy()
        assert list(_ranks(node0)) == [0] and list(_ranks(node1)) == [1]
        assert httpx.post(node1.url + "/generate", json={}).status_code >= 400  # health only
        r = httpx.post(node0.url + "/generate", json={"input_ids": ids, "sampling_params": params})
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == expected
        pids = node0.child_pids() + node1.child_pids()
        node0.stop()
        node1.proc.wait(10)
        assert not wait_gone(pids), "rank processes outlived their nodes"
    finally:
        node0.stop()
        node1.stop()


def test_a_node_whose_rank_0_never_comes_gives_up_after_the_timeout(tiny_folder):
    from server.server_process import free_port

    node1 = ServerProcess(
        *server_flags(), "--model-path", str(tiny_folder), "--tp-size", "2", "--nnodes", "2",
        "--node-rank", "1", "--dist-init-addr", f"127.0.0.1:{free_port()}", "--dist-timeout", "3",
        "--grammar-backend", "none",
    )  # fmt: skip
    try:
        node1.proc.wait(60)
        assert node1.proc.returncode == 1
        assert "node 1 could not start" in node1.log() and "joining tcp://" in node1.log()
    finally:
        node1.stop()
