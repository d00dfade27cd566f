"""Per-request size limits of the API process (the `limits` flags): checked before any CPU work.

Each refusal is a 400 that says the size, the limit and the flag that sets it, so a client knows
what to shrink and an operator what to raise. Used by the TokenizerManager and the chat handler.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixgen.errors import InvalidRequestError
from radixgen.server_args import LimitsConfig


@dataclass(frozen=True)
class RequestLimits:
    config: LimitsConfig

    def check_prompt_chars(self, length: int, param: str) -> None:
        """A prompt's size in characters, before it is tokenized or rendered."""
        cap = self.config.max_prompt_chars
        if length > cap:
            # NOTE: worded without the field name: the OpenAI handlers rename `param` (text ->
            # prompt) but not the message
            what = "the messages have" if param == "messages" else "the prompt has"
            raise InvalidRequestError(
                f"{what} {length} characters; the limit is {cap} (--max-prompt-chars)", param
            )

    def check_sequences(self, n_sequences: int) -> None:
        """The sequences one request starts: prompts in a batch times n."""
        cap = self.config.max_sequences_per_request
        if cap is not None and n_sequences > cap:
            raise InvalidRequestError(
                f"the request starts {n_sequences} sequences (prompts x n); the limit is {cap} "
                "(--max-sequences-per-request)",
                "n",
            )

    def check_stop_strings(self, stop: list[str]) -> None:
        """Stop strings are matched on every step and held back in every streamed chunk: their
        number and length bound that per-token work."""
        count, chars = self.config.max_stop_strings, self.config.max_stop_string_chars
        if len(stop) > count:
            raise InvalidRequestError(
                f"stop has {len(stop)} strings; the limit is {count} (--max-stop-strings)", "stop"
            )
        for i, s in enumerate(stop):
            if len(s) > chars:
                raise InvalidRequestError(
                    f"stop string {i} has {len(s)} characters; the limit is {chars} "
                    "(--max-stop-string-chars)",
                    "stop",
                )

    def check_stop_regexes(self, patterns: list[str]) -> None:
        """stop_regex patterns are searched on every step and every streamed chunk: the stop-string
        limits bound their number and length too."""
        count, chars = self.config.max_stop_strings, self.config.max_stop_string_chars
        if len(patterns) > count:
            raise InvalidRequestError(
                f"stop_regex has {len(patterns)} patterns; the limit is {count} (--max-stop-strings)",
                "stop_regex",
            )
        for i, pattern in enumerate(patterns):
            if len(pattern) > chars:
                raise InvalidRequestError(
                    f"stop_regex pattern {i} has {len(pattern)} characters; the limit is {chars} "
                    "(--max-stop-string-chars)",
                    "stop_regex",
                )
