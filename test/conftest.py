"""Shared fixtures: the default model folder (converted once per machine) and engine helpers."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model_folder() -> str:
    from radixgen.runtime.model_loader import resolve_model_path

    return resolve_model_path(None)


@pytest.fixture(scope="session")
def chat_prompt(default_model_folder):
    """Render a user message through the default model's chat template."""
    from radixgen.runtime.text.tokenizer import Tokenizer

    tok = Tokenizer(default_model_folder)

    def render(text: str) -> str:
        return tok.apply_chat_template([{"role": "user", "content": text}])

    return render
