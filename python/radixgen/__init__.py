"""RadixGen: a programmable structured-generation runtime for LLMs.

Public names are re-exported lazily so `import radixgen` stays light (no torch at import time).
"""

from __future__ import annotations

import importlib
from typing import Any

from radixgen.version import __version__

_LAZY = {
    "Engine": "radixgen.runtime.entrypoints.engine",
    "ServerArgs": "radixgen.server_args",
    "SamplingParams": "radixgen.sampling_params",
}
# the frontend language (SGLang's names): `import radixgen as sgl` ports an SGLang program
_LANG_NAMES = (
    "function", "gen", "gen_int", "gen_string", "select", "image", "video",
    "system", "user", "assistant", "system_begin", "system_end", "user_begin", "user_end",
    "assistant_begin", "assistant_end", "separate_reasoning", "set_default_backend", "flush_cache", "get_server_info",
    "global_config", "greedy_token_selection", "constrained_choice", "token_length_normalized",
    "unconditional_likelihood_normalized", "RuntimeEndpoint", "OpenAI", "EngineBackend", "Runtime",
    "ProgramState", "ProgramError", "BackendError", "SglFunction",
)  # fmt: skip
_LAZY.update(dict.fromkeys(_LANG_NAMES, "radixgen.lang"))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'radixgen' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["__version__", *_LAZY]
