"""EngineBackend: programs on an in-process `radixgen.Engine` (no HTTP; same scheduler path).

The runtime is imported only when an engine is built here, so `radixgen.lang` stays light.
The chat template comes straight from the engine's tokenizer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixgen.lang.adapter_scope import current_adapter
from radixgen.lang.backend.native import NativeBackend
from radixgen.lang.chat_template import (
    TemplateShapeError,
    chat_template_for_source,
    get_chat_template_by_model_path,
)
from radixgen.lang.errors import BackendError

if TYPE_CHECKING:
    from radixgen.runtime.entrypoints.engine import ControlResult, Engine

_wrapped: dict[int, EngineBackend] = {}
_wrap_lock = threading.Lock()


class EngineBackend(NativeBackend):
    def __init__(self, engine: Engine | None = None, **engine_kwargs: Any) -> None:
        # Any: the Engine's flags (SGLang's names), forwarded to Engine(**engine_kwargs)
        """Wrap a running `radixgen.Engine`, or start one from `engine_kwargs`."""
        super().__init__()
        self._owns_engine = engine is None
        if engine is None:
            from radixgen.runtime.entrypoints.engine import Engine

            engine = Engine(**engine_kwargs)
        elif engine_kwargs:
            raise TypeError("give either an engine or arguments to start one, not both")
        self.engine = engine
        info = engine.tokenizer_manager.model_info()
        self.model_path = str(info.get("model_path") or "")
        self.chat_template = get_chat_template_by_model_path(self.model_path)
        tokenizer = engine.tokenizer
        template = getattr(tokenizer, "chat_template", None)
        if template is not None:
            try:
                eos_token = getattr(tokenizer, "eos_token", None)
                eos = eos_token if isinstance(eos_token, str) else ""
                self.chat_template = chat_template_for_source(template.source, eos, self.model_path)
            except TemplateShapeError:
                pass

    @classmethod
    def wrap(cls, engine: Engine) -> EngineBackend:
        """One backend per engine, so `set_default_backend(engine)` twice shares state."""
        with _wrap_lock:
            backend = _wrapped.get(id(engine))
            if backend is None or backend.engine is not engine:
                backend = _wrapped[id(engine)] = cls(engine)
            return backend

    def _call(self, payload: dict[str, Any], stream: bool = False) -> Any:
        try:
            return self.engine.generate(
                prompt=payload.get("text"),
                sampling_params=payload.get("sampling_params"),
                input_ids=payload.get("input_ids"),
                return_logprob=payload.get("return_logprob", False),
                logprob_start_len=payload.get("logprob_start_len"),
                top_logprobs_num=payload.get("top_logprobs_num"),
                return_text_in_logprobs=payload.get("return_text_in_logprobs", False),
                lora_path=current_adapter(),
                pin_prefix=bool(payload.get("pin_prefix")),
                stream=stream,
            )
        except ValueError as e:  # the engine's InvalidRequestError
            raise BackendError(str(e), 400) from e

    def _post(self, payload: dict[str, Any]) -> Any:
        return self._call(payload)

    def _post_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        chunks = self._call(payload, stream=True)
        try:
            yield from chunks
        except ValueError as e:
            raise BackendError(str(e), 400) from e

    def count_prompt_tokens(self, text: str) -> int:
        return len(self.engine.tokenizer.encode(text))

    def get_model_name(self) -> str:
        return self.model_path

    def flush_cache(self) -> ControlResult:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict[str, object]:
        info = self.engine.get_server_info()
        return info

    def shutdown(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()

    def __repr__(self) -> str:
        return f"EngineBackend({self.model_path!r})"
