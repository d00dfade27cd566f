"""radixgen.lang: SGLang's frontend language (`@function`, `gen`, `select`, roles, fork) on RadixGen.

An SGLang program ports by changing its import: `import radixgen as sgl` (or `radixgen.lang`).
Backends load lazily, so importing this package pulls in neither torch nor the runtime.
"""

from __future__ import annotations

import importlib
from typing import Any

from radixgen.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    image,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixgen.lang.chat_template import ChatTemplate, get_chat_template
from radixgen.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixgen.lang.errors import BackendError, ProgramError
from radixgen.lang.function import SglFunction
from radixgen.lang.global_config import global_config
from radixgen.lang.interpreter import ProgramState, ProgramStateGroup

_LAZY_BACKENDS = {
    "RuntimeEndpoint": "radixgen.lang.backend.runtime_endpoint",
    "EngineBackend": "radixgen.lang.backend.engine",
    "OpenAI": "radixgen.lang.backend.openai",
}


def __getattr__(name: str) -> Any:
    module = _LAZY_BACKENDS.get(name)
    if module is None:
        raise AttributeError(f"module 'radixgen.lang' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "BackendError",
    "ChatTemplate",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "SglFunction",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_chat_template",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "image",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
    *_LAZY_BACKENDS,
]
