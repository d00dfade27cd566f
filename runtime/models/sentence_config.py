"""How an embedding model turns token states into one vector, read from its sentence-transformers
files (any process; no torch).

A sentence-transformers folder says it in `modules.json` (the module chain), the Pooling
module's `config.json` (cls, mean or last token), a `Normalize` module (L2) and
`sentence_bert_config.json` (`max_seq_length`, which may be shorter than the position table).
A folder without them gets the architecture's usual choice; `--pooling` overrides the mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixgen.errors import InvalidRequestError

POOLING_MODES = ("cls", "mean", "last")
# sentence-transformers' config keys -> our mode (max and mean_sqrt_len are not served)
_ST_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
}
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")


def _bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, "model_path")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise _bad(f"{path} is not readable JSON: {e}") from e


@dataclass(frozen=True)
class PoolingConfig:
    mode: str  # one of POOLING_MODES
    normalize: bool  # L2-normalise the pooled vector
    max_seq_length: int | None  # the model's own input limit in tokens (None: the position table)
    source: str  # where the choice came from, for the start-up log

    @classmethod
    def from_folder(
        cls, folder: str | Path, default_mode: str, override: str | None = None
    ) -> PoolingConfig:
        """The folder's sentence-transformers choice, else `default_mode` with normalisation;
        `override` (the --pooling flag) replaces the mode either way."""
        if override is not None and override not in POOLING_MODES:
            raise InvalidRequestError(
                f"pooling {override!r} is not one of {POOLING_MODES}", "pooling"
            )
        folder = Path(folder)
        found = _from_sentence_transformers(folder)
        if found is None:
            found = cls(default_mode, True, None, "the architecture's default")
        if override is not None:
            found = cls(override, found.normalize, found.max_seq_length, "--pooling")
        return found


def _from_sentence_transformers(folder: Path) -> PoolingConfig | None:
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return None
    modules = _read_json(modules_path)
    if not isinstance(modules, list):
        raise _bad(f"{modules_path} is not a list of modules")
    types = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    pooling = types.get("Pooling")
    if pooling is None:
        raise _bad(f"{modules_path} has no Pooling module")
    pool_cfg = _read_json(folder / str(pooling.get("path", "")) / "config.json")
    modes = [mode for key, mode in _ST_MODES.items() if pool_cfg.get(key)]
    unsupported = [key for key in _ST_UNSUPPORTED if pool_cfg.get(key)]
    if unsupported or len(modes) != 1:
        raise _bad(
            f"{folder}: pooling {unsupported or modes or 'none'} is not served "
            f"(exactly one of {POOLING_MODES})"
        )
    max_len = None
    bert_cfg = folder / "sentence_bert_config.json"
    if bert_cfg.is_file():
        value = _read_json(bert_cfg).get("max_seq_length")
        max_len = int(value) if value else None
    return PoolingConfig(modes[0], "Normalize" in types, max_len, str(modules_path))
