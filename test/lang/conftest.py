"""Shared real backends for test/lang: ONE server process (also serving /v1 for the OpenAI
backend) and ONE in-process Engine, each started once per session on the default model."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiers import mark_fixture_users_slow

import radixgen as rg
from radixgen.lang.backend.runtime_endpoint import RuntimeEndpoint

TEST_DIR = Path(__file__).resolve().parents[1]
EXAMPLES_DIR = TEST_DIR.parent / "examples"
for folder in (TEST_DIR, EXAMPLES_DIR):  # test/server helpers and the example modules
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from server.server_process import ServerProcess, running_server, server_flags  # noqa: E402


def pytest_collection_modifyitems(config, items):
    # `backend` picks endpoint or engine_backend at run time (getfixturevalue): named too
    mark_fixture_users_slow(items, TEST_DIR / "lang", {"lang_server", "engine_backend", "backend"})


@pytest.fixture(scope="session")
def lang_server() -> Iterator[ServerProcess]:
    with running_server(*server_flags()) as proc:
        yield proc


class RecordingEndpoint(RuntimeEndpoint):
    """A real RuntimeEndpoint that also keeps the /generate payloads it sent (to count them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.payloads: list[dict[str, Any]] = []

    def _post(self, payload: dict[str, Any]) -> Any:
        self.payloads.append(payload)
        return super()._post(payload)

    def _post_stream(self, payload: dict[str, Any]) -> Any:
        self.payloads.append(payload)
        return super()._post_stream(payload)


@pytest.fixture(scope="session")
def endpoint(lang_server) -> RecordingEndpoint:
    return RecordingEndpoint(lang_server.url)


@pytest.fixture(scope="session")
def engine_backend() -> Iterator[Any]:
    backend = rg.EngineBackend(num_threads=1, log_level="warning")
    try:
        yield backend
    finally:
        backend.shutdown()


@pytest.fixture(params=["endpoint", "engine"])
def backend(request) -> Any:
    """Each primitive runs on both native backends (HTTP server and in-process Engine)."""
    return request.getfixturevalue("endpoint" if request.param == "endpoint" else "engine_backend")


@pytest.fixture(scope="session")
def openai_chat(lang_server) -> Any:
    return rg.OpenAI("SmolLM2-135M-Instruct", base_url=lang_server.url + "/v1", api_key="unused")


@pytest.fixture(scope="session")
def openai_completion(lang_server) -> Any:
    return rg.OpenAI(
        "SmolLM2-135M-Instruct",
        is_chat_model=False,
        base_url=lang_server.url + "/v1",
        api_key="unused",
    )


@pytest.fixture(autouse=True)
def _restore_global_config() -> Iterator[None]:
    """Tests flip optimisation flags and the default backend; each starts from the defaults."""
    config = rg.global_config
    saved = dict(vars(config))
    yield
    vars(config).update(saved)
