"""radixgen.lang: SGLang's frontend language (`@function`, `gen`, `select`, roles, fork) on RadixGen.

An SGLang program ports by changing its import: `import radixgen as sgl` (or `radixgen.lang`).
Backends load lazily, so importing this package pulls in neither torch nor the runtime.

Where we differ from SGLang 0.5.23, on purpose:
- `f.run()` returns a state whose `error()` holds a failed statement's error, as SGLang's does,
  and that error is a `ProgramError` naming the program line that queued the statement (its
  cause is the backend's error); reading a variable the failure left unset raises it where
  SGLang raises KeyError. `run_batch` also keeps an exception raised by a program's own code
  in that program's `error()` where SGLang's run_batch raises it and loses the other results.
- `choices_method=constrained_choice` (gen or select) decodes under a grammar of the choices
  instead of scoring them (SGLang's only way is scoring, our default too).
- `json_schema` also takes a dict or a pydantic model class; `s["x"]` stays the text and
  `s.parsed("x")` gives the typed value (model instance, dict, int/float/bool for dtype).
- role markers come from the served model's own chat template (see chat_template.py), so
  SmolLM2 gets ChatML plus its default system prompt without naming a template.
- `separate_reasoning` also splits a streamed run's variable once its gen is done (SGLang skips
  it when streaming); the text already streamed keeps the reasoning.
- select's null logprob entries count as 0.0 where SGLang's greedy/unconditional rules crash.
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
    separate_reasoning,
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
    constrained_choice,
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
    "Runtime": "radixgen.lang.local_runtime",
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
    "constrained_choice",
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
    "separate_reasoning",
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
