"""LoRA adapters from `@function` programs on every backend: `run(lora_path=...)` runs a program's
requests under an adapter, a gen / select may name another, `run_batch(lora_path=...)` caches the
batch prefix under it; the native backends send `lora_path`, the OpenAI backend names the adapter
as the `model`. A real server (and an in-process Engine) on a tiny random Llama with two random
adapters; each program's text equals the same request sent straight to the API.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from model_harness import build_hf_model, save_hf_model, tiny_config
from server.server_process import ServerProcess, running_server, server_flags
from test_lora import make_adapter

import radixgen as rg
from radixgen.lang.backend.runtime_endpoint import RuntimeEndpoint
from radixgen.lang.errors import BackendError, ProgramError
from radixgen.runtime.model_loader.resolve import resolve_model_path

pytestmark = pytest.mark.slow  # starts a server and an Engine (real processes)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
N = 8
GEN = {"max_tokens": N, "temperature": 0, "ignore_eos": True}
QUESTION = "The three largest rivers of Europe are"


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """A tiny random Llama with the default model's tokenizer (text prompts), adapters a, b."""
    root = tmp_path_factory.mktemp("lora_programs")
    base = build_hf_model(tiny_config("llama_gqa", vocab_size=49152), seed=3)
    folder = save_hf_model(base, root / "base")
    default = Path(resolve_model_path(None))
    for name in _TOKENIZER_FILES:
        if (default / name).exists():
            shutil.copy(default / name, folder / name)
    adapters = {name: make_adapter(base, root / name, seed=i, rank=8)[1]
                for i, name in enumerate(("a", "b"))}  # fmt: skip
    return folder, adapters


@pytest.fixture(scope="module")
def lora_server(lora_model: tuple[Path, dict[str, Path]]) -> Iterator[ServerProcess]:
    folder, adapters = lora_model
    flags = ["--model-path", str(folder), "--dtype", "float32", "--max-total-tokens", "4096"]
    flags += ["--served-model-name", "tiny", "--lora-paths"]
    flags += [f"{name}={path}" for name, path in adapters.items()]
    with running_server(*flags, *server_flags()) as proc:
        yield proc


class RecordingEndpoint(RuntimeEndpoint):
    """A real RuntimeEndpoint that keeps the /generate payloads as sent (adapter included)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[dict[str, Any]] = []

    def _request(self, method: str, path: str, body: Any = None, stream: bool = False) -> Any:
        if path == "/generate":
            self.sent.append(body)
        return super()._request(method, path, body, stream)


@rg.function
def two_calls(s, question):
    s += question
    s += rg.gen("first", **GEN)
    s += rg.gen("second", lora_path="b", **GEN)


PREFIX = "Answer with the names of rivers only, longest first, in one line of text. "


@rg.function
def prefixed(s, question):
    s += PREFIX + question
    s += rg.gen("first", **GEN)


@rg.function
def pick(s, question):
    s += question + " "
    s += rg.select("river", choices=["Volga", "Danube", "Rhine"])


def direct(http: httpx.Client, text: str, lora: str | None, stops: list[str]) -> str:
    """The same greedy request straight to /generate."""
    params = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True, "stop": stops}
    body = {"text": text, "sampling_params": params, "lora_path": lora}
    res = http.post("/generate", json=body)
    assert res.status_code == 200, res.text
    return str(res.json()["text"])


def test_programs_run_under_the_run_and_call_adapters(lora_server: ServerProcess) -> None:
    endpoint = RecordingEndpoint(lora_server.url)
    stops = list(endpoint.get_chat_template().stop_str)
    with httpx.Client(base_url=lora_server.url, timeout=120) as http:
        state = two_calls.run(question=QUESTION, lora_path="a", backend=endpoint)
        first = direct(http, QUESTION, "a", stops)
        assert state["first"] == first
        assert state["second"] == direct(http, QUESTION + first, "b", stops)
        assert [p.get("lora_path") for p in endpoint.sent] == ["a", "b"]

        base = two_calls.run(question=QUESTION, backend=endpoint)
        assert base["first"] == direct(http, QUESTION, None, stops)
        assert base["first"] != state["first"]  # the adapter changes the output
        assert [p.get("lora_path") for p in endpoint.sent[2:]] == [None, "b"]

        # a select's every request (prefix prefill, scoring) runs under the run's adapter
        endpoint.sent.clear()
        picked = pick.run(question=QUESTION, lora_path="a", backend=endpoint)
        assert endpoint.sent and {p.get("lora_path") for p in endpoint.sent} == {"a"}
        scores_a = picked.get_meta_info("river")["normalized_prompt_logprobs"]
        scores_base = pick.run(question=QUESTION, backend=endpoint).get_meta_info("river")
        assert scores_a != scores_base["normalized_prompt_logprobs"]

        # run_batch: every program, and the batch's constant prefix prefill, under the adapter
        endpoint.sent.clear()
        questions = [f"list {i}:" for i in range(3)]
        states = prefixed.run_batch([{"question": q} for q in questions], lora_path="a",
                                    backend=endpoint)  # fmt: skip
        want = [direct(http, PREFIX + q, "a", stops) for q in questions]
        assert [s["first"] for s in states] == want
        prefills = [p for p in endpoint.sent if p["sampling_params"]["max_new_tokens"] == 0]
        assert prefills and all(p.get("lora_path") == "a" for p in prefills)
        assert {p.get("lora_path") for p in endpoint.sent} == {"a"}

        # an adapter the server does not hold: the state keeps the server's 400 (SGLang's way)
        failed = two_calls.run(question=QUESTION, lora_path="zz", backend=endpoint)
        error = failed.error()
        assert isinstance(error, ProgramError) and isinstance(error.__cause__, BackendError)
        assert error.__cause__.status == 400 and "'zz' is not loaded" in str(error)


def test_openai_backend_names_the_adapter_as_the_model(lora_server: ServerProcess) -> None:
    oai = rg.OpenAI("tiny", is_chat_model=False, base_url=lora_server.url + "/v1", api_key="unused")
    stops = list(oai.get_chat_template().stop_str)
    with httpx.Client(base_url=lora_server.url, timeout=120) as http:
        state = two_calls.run(question=QUESTION, lora_path="a", backend=oai)
        first = direct(http, QUESTION, "a", stops)
        assert state["first"] == first
        assert state["second"] == direct(http, QUESTION + first, "b", stops)
        assert two_calls.run(question=QUESTION, backend=oai)["first"] == direct(
            http, QUESTION, None, stops
        )


def test_engine_backend_passes_the_adapter(lora_model: tuple[Path, dict[str, Path]]) -> None:
    folder, adapters = lora_model
    backend = rg.EngineBackend(
        model_path=str(folder),
        dtype="float32",
        max_total_tokens=4096,
        num_threads=1,
        log_level="warning",
        lora_paths=[f"{name}={path}" for name, path in adapters.items()],
    )
    try:
        stops = list(backend.get_chat_template().stop_str)
        params = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True, "stop": stops}

        def direct_engine(text: str, lora: str | None) -> str:
            out = backend.engine.generate(prompt=text, sampling_params=params, lora_path=lora)
            return str(out["text"])

        state = two_calls.run(question=QUESTION, lora_path="a", backend=backend)
        assert state["first"] == direct_engine(QUESTION, "a")
        assert state["second"] == direct_engine(QUESTION + state["first"], "b")
        assert state["first"] != direct_engine(QUESTION, None)
    finally:
        backend.shutdown()
