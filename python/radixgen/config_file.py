"""SGLang's `--config flags.yaml`: a YAML mapping of launch flags, read before the command line is
parsed. The file's flags go first, so a flag also given on the command line wins, as in SGLang.

    model-path: /models/x        # or model_path; a flag name without its dashes
    enable-metrics: true         # a switch: true turns it on, false leaves it out
    cuda-graph-bs: [1, 2, 4]     # a flag that takes several values
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from radixgen.errors import InvalidRequestError

CONFIG_FLAG = "--config"


def expand_config_file(argv: list[str]) -> list[str]:
    """`argv` (after any subcommand) with `--config FILE` replaced by the file's flags, put before
    the rest. Several `--config` files are read in order."""
    out_front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == CONFIG_FLAG or arg.startswith(CONFIG_FLAG + "="):
            if "=" in arg:
                path = arg.split("=", 1)[1]
            elif i + 1 < len(argv):
                path = argv[i + 1]
                i += 1
            else:
                raise InvalidRequestError(f"{CONFIG_FLAG} needs a YAML file path", "config")
            out_front += _flags_of(path)
        else:
            rest.append(arg)
        i += 1
    return out_front + rest


def _flags_of(path: str) -> list[str]:
    import yaml

    try:
        data = yaml.safe_load(Path(path).expanduser().read_text())
    except OSError as e:
        raise InvalidRequestError(f"{CONFIG_FLAG} {path}: {e.strerror}", "config") from e
    except yaml.YAMLError as e:
        raise InvalidRequestError(f"{CONFIG_FLAG} {path}: not valid YAML ({e})", "config") from e
    if data is None:
        return []
    if not isinstance(data, dict):
        raise InvalidRequestError(f"{CONFIG_FLAG} {path}: must hold a mapping of flags", "config")
    flags: list[str] = []
    for key, value in data.items():
        flags += _tokens(str(key), value, path)
    return flags


def _tokens(key: str, value: Any, path: str) -> list[str]:
    flag = "--" + key.removeprefix("--").replace("_", "-")
    if isinstance(value, bool):
        return [flag] if value else []
    if value is None:
        return []
    if isinstance(value, list):
        return [flag, *(str(v) for v in value)]
    if isinstance(value, dict):
        raise InvalidRequestError(
            f"{CONFIG_FLAG} {path}: {key} must be a value or a list, not a mapping", "config"
        )
    return [flag, str(value)]
