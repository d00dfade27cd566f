"""Shared fixtures: the default model folder (converted once per machine) and engine helpers."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# NOTE: this process's idle OpenMP workers (torch's pool, which the native kernels share) sleep
# instead of spinning: on a shared 2-core machine spinning workers starve the one doing the work
# (the kernel tests ran 5x slower under load). libgomp reads the setting once, when torch loads
# it; it is then taken out again so that Engine and server children keep the launcher's choice.
if "OMP_WAIT_POLICY" not in os.environ and "torch" not in sys.modules:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    import torch  # noqa: F401

    del os.environ["OMP_WAIT_POLICY"]


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    # scripts/test_triton_cpu.sh runs the `triton_interpret` ones on CPU, interpreted
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        # NOTE: markers, not keywords: a folder named like a marker (test/gpu/) is a keyword too
        gpu = item.get_closest_marker("gpu") is not None
        if gpu and not (interpreting and item.get_closest_marker("triton_interpret") is not None):
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
