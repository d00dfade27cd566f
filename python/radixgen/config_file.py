"""SGLang's `--config flags.yaml`: a YAML mapping of launch flags, read before the command line is
parsed. The file's flags go first, so a flag also given on the command line wins, as in SGLang.

    model-path: /models/x        # or model_path; a flag name without its dashes
    enable-metrics: true         # a switch: true turns it on, false leaves it out
    cuda-graph-bs: [1, 2, 4]     # a flag that takes several values
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

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
    try:
        return flags_to_argv(data)
    except ValueError as e:
        raise InvalidRequestError(f"{CONFIG_FLAG} {path}: {e}", "config") from e


def flags_to_argv(flags: Mapping[object, object]) -> list[str]:
    """`{"tp_size": 1, "trust_remote_code": True}` -> `["--tp-size", "1", "--trust-remote-code"]`
    (also what a launcher of `launch_server` with keyword arguments needs)."""
    argv: list[str] = []
    for key, value in flags.items():
        flag = "--" + str(key).removeprefix("--").replace("_", "-")
        if isinstance(value, dict):
            raise ValueError(f"{key} must be a value or a list, not a mapping")
        if value is None or value is False:
            continue  # the default; a switch left off
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):  # a flag of several values
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv
