"""Issue 12, grammar compiles, through real HTTP: deep schemas are 400s naming the limit (native
and OpenAI routes, schema as an object), and they never fail another client's cheap regex."""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from wait_helpers import wait_until

from .conftest import needs_grammar
from .server_process import ServerProcess, server_flags, wait_gone


# built as text: the client's own json.dumps would hit Python's recursion limit on these
def nested_object_schema(depth: int) -> str:
    return '{"type":"object","properties":{"a":' * depth + '{"type":"integer"}' + "}}" * depth


def nested_array_schema(depth: int) -> str:
    return '{"type":"array","items":' * depth + '{"type":"integer"}' + "}" * depth


def post_json(http: httpx.Client, path: str, body: str) -> httpx.Response:
    return http.post(path, content=body, headers={"Content-Type": "application/json"})


def assert_depth_400(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "grammar_max_depth" in error["message"] and "nested more than" in error["message"]
    assert error["type"] == "invalid_request_error"


@needs_grammar
def test_500_deep_object_schema_is_a_400_on_native_and_openai_routes(http):
    schema = nested_object_schema(500)  # json.dumps of it used to raise RecursionError (a 500)
    native = '{"text":"x","sampling_params":{"max_new_tokens":4,"json_schema":' + schema + "}}"
    assert_depth_400(post_json(http, "/generate", native))
    openai = (
        '{"messages":[{"role":"user","content":"x"}],"max_tokens":4,'
        '"response_format":{"type":"json_schema","json_schema":{"name":"deep","schema":'
        + schema
        + "}}}"
    )
    assert_depth_400(post_json(http, "/v1/chat/completions", openai))
    tools = (
        '{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"tool_choice":"required",'
        '"tools":[{"type":"function","function":{"name":"f","parameters":' + schema + "}}]}"
    )
    assert_depth_400(post_json(http, "/v1/chat/completions", tools))  # also in the prompt
    assert http.get("/health").status_code == 200


@needs_grammar
def test_deep_schemas_do_not_fail_another_clients_cheap_regex(http):
    """The issue's repro, default limits: the deep schemas are 400s before any compile."""
    answer, replies = repro(http)
    assert answer.status_code == 200, answer.text
    assert answer.json()["text"] in ("yes", "no")
    for r in replies:
        assert_depth_400(r)
    state = http.get("/server_info").json()["internal_states"][0]
    assert state["grammar_compile_timeouts"] == 0  # refused up front, never compiled


def repro(http: httpx.Client) -> tuple[httpx.Response, list[httpx.Response]]:
    """The issue's repro: three ~900-deep array schemas sent with a trivial `(yes|no)` regex;
    returns (the regex's reply, the schemas' replies)."""

    def deep(i: int) -> httpx.Response:
        spec = nested_array_schema(900 + i)
        body = '{"text":"x","sampling_params":{"max_new_tokens":4,"json_schema":' + spec + "}}"
        return post_json(http, "/generate", body)

    def cheap() -> httpx.Response:
        params = {"regex": "(yes|no)", "max_new_tokens": 4, "temperature": 0}
        return http.post("/generate", json={"text": "Yes or no? ", "sampling_params": params})

    with ThreadPoolExecutor(4) as pool:
        deep_futures = [pool.submit(deep, i) for i in range(3)]
        cheap_future = pool.submit(cheap)
        return cheap_future.result(), [f.result() for f in deep_futures]


@needs_grammar
@pytest.mark.slow
def test_deep_schemas_under_a_raised_limit_are_killed_at_the_deadline_and_leave_no_process():
    """With the depth limit raised, the 900-deep compiles run (for minutes and gigabytes if let
    go): each is killed at the deadline, the regex is served, and every process ends with the
    server."""
    srv = ServerProcess(
        "--grammar-max-depth", "5000", "--grammar-compile-timeout", "1", *server_flags()
    )  # fmt: skip
    try:
        srv.wait_healthy()
        with httpx.Client(base_url=srv.url, timeout=120.0) as http:
            answer, replies = repro(http)
            assert answer.status_code == 200 and answer.json()["text"] in ("yes", "no")
            for r in replies:
                assert r.status_code == 400, r.text
                assert "took longer than 1 s (grammar_compile_timeout)" in r.text
            state = http.get("/server_info").json()["internal_states"][0]
            assert state["grammar_compile_timeouts"] == 3
            assert state["grammar_compile_worker_kills"] == 3

            def workers_alive() -> int:
                return http.get("/server_info").json()["internal_states"][0][
                    "grammar_compile_workers_alive"
                ]

            wait_until(lambda: workers_alive() == 2, 30, what="replacement workers")
        pids = srv.child_pids()  # launcher children, the forkserver and the compile workers
        assert len(pids) >= 5
    finally:
        code = srv.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM), srv.log()
    assert not wait_gone(pids), "grammar processes outlived the server"
