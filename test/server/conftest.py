"""One real server process for all of test/server (started once, shared, stopped at the end)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from tiers import mark_fixture_users_slow

from .server_process import grammar_available, running_server, server_flags

needs_grammar = pytest.mark.skipif(
    not grammar_available(),
    reason="constrained decoding is off until runtime/constrained/grammar_manager.py lands",
)


def pytest_collection_modifyitems(config, items):
    mark_fixture_users_slow(items, Path(__file__).parent, {"server"})


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    data = str(tmp_path_factory.mktemp("server-data"))  # the Files / Batch APIs' own folder
    flags = ("--enable-metrics", "--log-requests", "--data-dir", data, *server_flags())
    with running_server(*flags) as proc:
        yield proc


@pytest.fixture(scope="session")
def base_url(server) -> str:
    return server.url


@pytest.fixture(scope="session")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=120.0) as client:
        yield client


@pytest.fixture(scope="session")
def oai(base_url):
    import openai

    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
