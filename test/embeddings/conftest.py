"""One real embedding server (`--is-embedding`, the bundled all-MiniLM-L6-v2) for all of
test/embeddings, started once and shared; its tests are in the slow tier."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from server.server_process import running_server, server_flags
from tiers import mark_fixture_users_slow


def pytest_collection_modifyitems(config, items):
    mark_fixture_users_slow(items, Path(__file__).parent, {"embedding_server"})


@pytest.fixture(scope="session")
def embedding_server():
    pytest.importorskip("sentence_transformers")
    with running_server("--is-embedding", *server_flags()) as proc:
        yield proc


@pytest.fixture(scope="session")
def http(embedding_server):
    with httpx.Client(base_url=embedding_server.url, timeout=120.0) as client:
        yield client


@pytest.fixture(scope="session")
def oai(embedding_server):
    import openai

    return openai.OpenAI(
        base_url=embedding_server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )


@pytest.fixture(scope="session")
def reference(embedding_server):
    """sentence-transformers on the same unpacked folder the server loaded."""
    from sentence_transformers import SentenceTransformer

    info = httpx.get(embedding_server.url + "/model_info", timeout=30).json()
    return SentenceTransformer(info["model_path"], device="cpu")
