"""The backend interface the interpreter calls: generate, stream, select, prefill, cache control.

Backends receive the program's StreamExecutor (`s`): its `text_` is the prompt so far and its
`messages_` the chat turns, so a chat-only API can send messages instead of text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixgen.lang.chat_template import ChatTemplate, get_chat_template
from radixgen.lang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixgen.lang.ir import SglSamplingParams

if TYPE_CHECKING:
    from radixgen.lang.executor import StreamExecutor


class BaseBackend:
    """Defaults for optional operations; `generate`, `generate_stream` and `select` are required."""

    is_chat_model = False

    def __init__(self) -> None:
        self.chat_template: ChatTemplate = get_chat_template("default")

    def get_model_name(self) -> str:
        raise NotImplementedError

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    def cache_prefix(self, prefix_str: str) -> None:
        """Prefill `prefix_str` so later requests reuse its KV cache (no-op if unsupported)."""

    def commit_lazy_operations(self, s: StreamExecutor) -> None:
        """fork(n): make the shared text cached before the branches start."""
        self.cache_prefix(s.text_)

    def end_program(self, s: StreamExecutor) -> None:
        pass

    def generate(
        self, s: StreamExecutor, sampling_params: SglSamplingParams
    ) -> tuple[Any, dict[str, Any]]:
        """(completion text, or a list of n texts; meta_info) for the state's text."""
        raise NotImplementedError

    def generate_stream(
        self, s: StreamExecutor, sampling_params: SglSamplingParams
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(text delta, meta_info of the chunk) pairs."""
        raise NotImplementedError

    def select(
        self,
        s: StreamExecutor,
        choices: list[str],
        temperature: float,
        choices_method: ChoicesSamplingMethod,
    ) -> ChoicesDecision:
        raise NotImplementedError

    def flush_cache(self) -> object:
        """The server's answer, if the backend has a cache to flush."""
        return None

    def get_server_info(self) -> object:
        """The server's info, if the backend has a server."""
        return None

    def shutdown(self) -> None:
        pass


def check_select_temperature(temperature: float) -> None:
    if temperature > 1e-5:
        raise ValueError(
            f"select scores choices by likelihood, so temperature must be 0 (got {temperature}); "
            "use choices_method=constrained_choice to sample a choice under a grammar"
        )
