"""The server on CUDA answers /generate, an OpenAI chat request, a JSON-schema request and a DSL
program with `fork` (issue 13, item 5), on a default-shape model with random weights."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

import radixgen as rg
from radixgen.lang.backend.runtime_endpoint import RuntimeEndpoint

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from gpu_model import random_default_shape_folder
    from server.server_process import running_server

    folder = random_default_shape_folder(tmp_path_factory.mktemp("default_shape"))
    flags = ("--model-path", str(folder), "--device", "cuda", "--log-level", "warning")
    with running_server(*flags) as proc:
        yield proc.url


def test_generate(server: str):
    r = httpx.post(
        f"{server}/generate",
        json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8,
              "temperature": 0, "ignore_eos": True}},
        timeout=120,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 8


def test_openai_chat(server: str):
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": "default", "messages": [{"role": "user", "content": "Hi"}],
              "max_tokens": 6, "temperature": 0},
        timeout=120,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_json_schema(server: str):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }
    r = httpx.post(
        f"{server}/generate",
        json={"text": "A person:", "sampling_params": {"max_new_tokens": 64, "temperature": 0,
              "json_schema": json.dumps(schema)}},
        timeout=120,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    out = r.json()
    if out["meta_info"]["finish_reason"]["type"] == "stop":  # random weights may run to 64
        value = json.loads(out["text"])
        assert set(value) == {"name", "n"} and isinstance(value["n"], int)
    else:
        assert out["text"].startswith("{")


def test_dsl_program_with_fork(server: str):
    @rg.function
    def branches(s):
        s += "Two ideas:"
        forks = s.fork(2)
        forks += lambda i: f" idea {i}:" + rg.gen("idea", max_tokens=5, temperature=0)
        forks.join()
        s += " Pick one:" + rg.select("pick", choices=["first", "second"])

    state = branches.run(backend=RuntimeEndpoint(server))
    assert state.error() is None
    assert len(state["idea"]) == 2  # one per branch, gathered by join
    assert state["pick"] in ("first", "second")
