"""Render a model's Jinja chat template in jinja2's immutable sandbox (runs in the API process).

`render_chat` also says which characters of the prompt came from message contents, so the
tokenizer can encode those as plain text: a user who types `<|im_start|>system` must not open a
system turn (see `RenderedChat`).
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixgen.errors import InvalidRequestError

logger = logging.getLogger(__name__)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: object, indent: int | None = None, ensure_ascii: bool = False, **_: object
) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@dataclass(frozen=True)
class RenderedChat:
    """A rendered chat prompt as segments: `(text, from_content)` in order.

    Template text may hold control tokens (`<|im_start|>`); message contents are client text whose
    special-token strings must stay plain text. `from_content` is False everywhere when the
    template transformed the contents in a way the segments could not follow (see `render_chat`).
    """

    segments: tuple[tuple[str, bool], ...]

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.segments)

    def truncated(self, end: int) -> RenderedChat:
        """The first `end` characters (continue_final_message cuts after the last content)."""
        out: list[tuple[str, bool]] = []
        left = end
        for text, from_content in self.segments:
            if left <= 0:
                break
            out.append((text[:left], from_content))
            left -= len(text)
        return RenderedChat(tuple(out))

    def with_suffix(self, template_text: str) -> RenderedChat:
        """Template text appended (e.g. the opening of a forced tool call)."""
        return RenderedChat((*self.segments, (template_text, False)))


class ChatTemplate:
    """A compiled chat template; `render` turns OpenAI-style messages into the prompt text."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self._template = env.from_string(source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._warned_untracked = False

    def render(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, object]] | None = None,
        **extra: object,
    ) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except TemplateError as e:
            raise InvalidRequestError(f"chat template error: {e}", "messages") from e
        except (TypeError, KeyError, AttributeError) as e:
            raise InvalidRequestError(
                f"messages do not fit the chat template: {e}", "messages"
            ) from e

    def render_chat(
        self,
        messages: Sequence[Mapping[str, object]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, object]] | None = None,
        **extra: object,
    ) -> RenderedChat:
        """Render, marking which text came from message contents.

        The template is rendered once with each string content replaced by a unique placeholder
        and once as is; splitting the first at the placeholders gives the segments. They are
        used only if putting the contents back (as given, or stripped, as templates that `trim`
        them do) reproduces the real rendering exactly; otherwise the template changed the
        contents in a way that cannot be followed, and the whole prompt is one template segment
        (the old behaviour, logged once per template).
        """
        text = self.render(messages, add_generation_prompt, tools, **extra)
        contents = [m.get("content") for m in messages]
        if not any(isinstance(c, str) and c for c in contents):
            return RenderedChat(((text, False),))
        nonce = secrets.token_hex(8)
        marked = [
            {**m, "content": f"\ue000{nonce}:{i}\ue001"} if isinstance(c, str) and c else m
            for i, (m, c) in enumerate(zip(messages, contents, strict=True))
        ]
        pieces = re.split(
            f"\ue000{nonce}:(\\d+)\ue001",
            self.render(marked, add_generation_prompt, tools, **extra),
        )
        for transform in (_as_given, str.strip):
            segments = [(pieces[0], False)]
            for k in range(1, len(pieces), 2):
                content = contents[int(pieces[k])]
                assert isinstance(content, str)
                segments += [(transform(content), True), (pieces[k + 1], False)]
            rendered = RenderedChat(tuple((t, c) for t, c in segments if t))
            if rendered.text == text:
                return rendered
        if not self._warned_untracked:
            self._warned_untracked = True
            logger.warning(
                "the chat template transforms message contents; special-token strings inside "
                "them are encoded as control tokens"
            )
        return RenderedChat(((text, False),))


def _as_given(text: str) -> str:
    return text
