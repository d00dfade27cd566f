"""Streamed chat deltas: reasoning_content, content and tool-call deltas from the text so far
(API process).

Every chunk's cumulative text is rescanned (reasoning split, then the tool-call parser), and what
was not sent yet goes out as one OpenAI delta. Tool calls stream as OpenAI does: first an entry
with the call's index, id, type and name (arguments ""), then argument fragments; the client
joins the fragments of an index into the call's `arguments`. A builder's delta may hold several
entries (a call's name and its first fragment arrive in one scan); `openai_deltas` splits it into
the deltas OpenAI sends, one tool-call entry each, because clients read only the first entry of a
chunk (instructor's partial streaming) or take two entries of one index for two calls (the openai
SDK's `chat.completions.stream`).
"""

from __future__ import annotations

from typing import TypedDict

from radixgen.reasoning_parser import ReasoningParser
from radixgen.runtime.entrypoints.openai.tool_parsers import CallView, ToolCallParser, new_call

# a streamed tool-call entry: `index` with the call's id, type and name, or with an arguments
# fragment (`{"index", "function": {"arguments"}}`)
ToolCallEntry = dict[str, object]


class ChatDelta(TypedDict, total=False):
    """One streamed chat delta (OpenAI's keys)."""

    role: str
    content: str
    reasoning_content: str
    tool_calls: list[ToolCallEntry]


class ToolCallStreamer:
    """Content and tool-call deltas of one choice; `prefix` is prompt text the parser must see
    (the opening of a forced call)."""

    def __init__(
        self, parser: ToolCallParser, names: set[str], max_calls: int | None, prefix: str = ""
    ) -> None:
        self.parser, self.names, self.max_calls, self.prefix = parser, names, max_calls, prefix
        self.sent_content = ""
        self.sent_args: list[str] = []

    @property
    def has_calls(self) -> bool:
        return bool(self.sent_args)

    def update(self, text: str) -> tuple[str, list[ToolCallEntry]]:
        """(content delta, tool-call delta entries) for the reply text so far."""
        scan = self.parser.scan(self.prefix + text, self.names, final=False)
        content = self._content(scan.content)
        return content, [] if scan.invalid else self._call_entries(scan.calls)

    def finish(self, text: str) -> tuple[str, list[ToolCallEntry]]:
        """The rest at the end: the remaining calls, or, when the reply holds none that parse,
        the held-back text as content."""
        full = self.prefix + text
        scan = self.parser.scan(full, self.names, final=True)
        parsed = (
            scan.started
            and not scan.invalid
            and bool(scan.calls)
            and all(c.complete and c.name for c in scan.calls)
        )
        if parsed or self.sent_args:
            content = self._content(scan.content)
            return content, [] if scan.invalid else self._call_entries(scan.calls)
        rest = full[max(len(self.sent_content), len(self.prefix)) :]
        self.sent_content += rest
        return rest, []

    def _content(self, before_calls: str) -> str:
        if self.sent_args:
            return ""
        target = before_calls.rstrip()  # whitespace before a call is not content
        if len(target) <= len(self.sent_content) or not target.startswith(self.sent_content):
            return ""
        out = target[len(self.sent_content) :]
        self.sent_content = target
        return out

    def _call_entries(self, views: list[CallView]) -> list[ToolCallEntry]:
        entries: list[ToolCallEntry] = []
        for index, view in enumerate(views[: self.max_calls]):
            if view.name is None:
                break  # calls are announced in order
            if index == len(self.sent_args):  # the name first, with arguments ""
                entries.append({"index": index, **new_call(view.name, "")})
                self.sent_args.append("")
            sent = self.sent_args[index]
            if len(view.arguments) > len(sent) and view.arguments.startswith(sent):
                fragment = view.arguments[len(sent) :]
                self.sent_args[index] = view.arguments
                entries.append({"index": index, "function": {"arguments": fragment}})
        return entries


def openai_deltas(delta: ChatDelta) -> list[ChatDelta]:
    """`delta` as OpenAI streams it: reasoning and content in the first delta, then each
    tool-call entry in a delta of its own (in order, so a call's name precedes its fragments)."""
    calls = delta.get("tool_calls")
    if not calls:
        return [delta] if delta else []
    text: ChatDelta = {**delta}
    del text["tool_calls"]
    return ([text] if text else []) + [{"tool_calls": [entry]} for entry in calls]


class ChatDeltaBuilder:
    """One choice's stream: reasoning first (held until its end when not `stream_reasoning`),
    then content and tool calls."""

    def __init__(
        self,
        reasoning: ReasoningParser | None,
        stream_reasoning: bool,
        tools: ToolCallStreamer | None,
    ) -> None:
        self.reasoning, self.stream_reasoning, self.tools = reasoning, stream_reasoning, tools
        self.sent_reasoning = ""
        self.sent_content = ""

    def update(self, text: str) -> ChatDelta:
        return self._delta(text, final=False)

    def finish(self, text: str) -> tuple[ChatDelta, bool]:
        """The last delta, and whether the reply holds tool calls."""
        delta = self._delta(text, final=True)
        return delta, self.tools is not None and self.tools.has_calls

    def _delta(self, text: str, final: bool) -> ChatDelta:
        delta: ChatDelta = {}
        content_text = text
        if self.reasoning is not None:
            split = self.reasoning.split(text, final)
            target = split.reasoning or ""
            if self.stream_reasoning or split.reasoning_done:
                if len(target) > len(self.sent_reasoning):
                    delta["reasoning_content"] = target[len(self.sent_reasoning) :]
                    self.sent_reasoning = target
            content_text = split.content
        if self.tools is not None:
            step = self.tools.finish if final else self.tools.update
            content, calls = step(content_text)
            if calls:
                delta["tool_calls"] = calls
        else:
            content = content_text[len(self.sent_content) :]
            self.sent_content = content_text
        if content:
            delta["content"] = content
        return delta
