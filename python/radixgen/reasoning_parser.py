"""Reasoning parsers: split a reply into its `<think>` reasoning and the answer (SGLang's names).

Shared by the API process (OpenAI `reasoning_content`, plain and streamed) and the DSL
(`separate_reasoning`), so it imports nothing but the standard library.

A split is computed from the whole text so far (not from deltas), so streaming and the final
parse agree by construction: the reasoning so far only grows until the end tag, the answer only
grows after it, and text that may be the start of a tag is held back until it is not.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    """How a model family marks its reasoning."""

    name: str
    # True: the reply starts inside the reasoning (the template opened <think> in the prompt,
    # or the model never writes it), so all text up to </think> is reasoning
    starts_in_reasoning: bool
    open_tag: str = THINK_OPEN
    close_tag: str = THINK_CLOSE


REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "deepseek-r1": ReasoningFormat("deepseek-r1", starts_in_reasoning=True),
    "qwen3": ReasoningFormat("qwen3", starts_in_reasoning=False),
    "qwen3-thinking": ReasoningFormat("qwen3-thinking", starts_in_reasoning=True),
}
REASONING_PARSER_NAMES: tuple[str, ...] = tuple(REASONING_FORMATS)


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str | None  # None: the reply has no reasoning part
    content: str
    reasoning_done: bool  # the close tag was seen (or the text was final)


def partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `tag` (0 if none)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningParser:
    """Splits one reply; `enabled=False` (e.g. qwen3 with enable_thinking=false) keeps it whole."""

    def __init__(self, model_type: str, enabled: bool = True) -> None:
        if model_type not in REASONING_FORMATS:
            raise ValueError(
                f"unknown reasoning parser {model_type!r}; one of {', '.join(REASONING_FORMATS)}"
            )
        self.format = REASONING_FORMATS[model_type]
        self.enabled = enabled

    def split(self, text: str, final: bool = True) -> ReasoningSplit:
        """The reasoning and answer in `text`; with final=False, what is safe to show so far."""
        fmt = self.format
        if not self.enabled:
            return ReasoningSplit(None, text, True)
        stripped = text.lstrip()
        lead = len(text) - len(stripped)
        if stripped.startswith(fmt.open_tag):
            body = lead + len(fmt.open_tag)
        elif not final and fmt.open_tag.startswith(stripped):
            return ReasoningSplit(None, "", False)  # may still become <think>
        elif fmt.starts_in_reasoning:
            body = 0
        else:
            return ReasoningSplit(None, text, True)
        end = text.find(fmt.close_tag, body)
        if end != -1:
            content = text[end + len(fmt.close_tag) :].lstrip()
            return ReasoningSplit(text[body:end], content, True)
        if final:
            return ReasoningSplit(text[body:], "", True)  # cut short inside the reasoning
        hold = partial_tag_len(text, fmt.close_tag)
        return ReasoningSplit(text[body : len(text) - hold], "", False)

    def parse(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, answer) of a finished reply."""
        s = self.split(text, final=True)
        return s.reasoning, s.content
