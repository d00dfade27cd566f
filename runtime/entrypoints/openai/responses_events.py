"""The Responses API's stream events for one reply, built from the chat pipeline's deltas (API
process; no I/O, so the sequence is unit-tested without a server).

OpenAI's order: `response.created`, `response.in_progress`; per output item
`response.output_item.added`, then for text `response.content_part.added`, the
`response.output_text.delta`s (`response.reasoning_text.delta`s for reasoning),
`response.output_text.done`, `response.content_part.done`, or for a call the
`response.function_call_arguments.delta`s and `.done`; then `response.output_item.done`; and last
`response.completed` (`response.incomplete` when max_output_tokens cut the reply,
`response.failed` after an `error` event). One item is open at a time: a new one closes the
previous. Every event carries a `sequence_number`; events hold copies, so later deltas do not
change events already built.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from radixgen.runtime.entrypoints.openai import responses_items as items
from radixgen.runtime.entrypoints.openai.chat_deltas import ChatDelta

Event = dict[str, Any]

# item type -> (its event types' prefix, extra fields of its delta and done events)
_TEXT_EVENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "message": ("response.output_text", {"logprobs": []}),
    "reasoning": ("response.reasoning_text", {}),
}


def sse(event: Event) -> bytes:
    """`event: <type>` and `data: <json>`, as OpenAI's Responses stream writes them."""
    kind: str = event["type"]
    data: bytes = orjson.dumps(event)
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


class ResponseEvents:
    """Builds one response's event sequence. `response` is the in-progress `Response` object
    (its `output` is filled here)."""

    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response
        self.output: list[dict[str, Any]] = []
        self.sequence = 0
        self._open: int | None = None  # output index of the item still receiving deltas
        self._calls: dict[int, int] = {}  # chat tool-call index -> output index

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.sequence, **copy.deepcopy(fields)}
        self.sequence += 1
        return event

    def start(self) -> list[Event]:
        snapshot = {**self.response, "status": "in_progress", "output": []}
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def update(self, delta: ChatDelta) -> list[Event]:
        """Events for one chat delta (`reasoning_content`, `content`, `tool_calls` entries)."""
        events: list[Event] = []
        if delta.get("reasoning_content"):
            events += self._text("reasoning", delta["reasoning_content"])
        if delta.get("content"):
            events += self._text("message", delta["content"])
        for entry in delta.get("tool_calls") or []:
            events += self._call(entry)
        return events

    def finish(
        self,
        status: str,
        usage: dict[str, Any] | None,
        incomplete: dict[str, str] | None = None,
    ) -> list[Event]:
        """Close the open item (an empty message if nothing was said) and end the response;
        `status` is "completed" or "incomplete"."""
        events: list[Event] = []
        if not self.output:
            events += self._open_item(items.message_item("", "in_progress"))
        events += self._close(status)
        self.response = {
            **self.response,
            "status": status,
            "output": self.output,
            "usage": usage,
            "incomplete_details": incomplete,
        }
        if status != "completed":
            self.response["completed_at"] = None
        kind = "response.completed" if status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=self.response))
        return events

    def fail(self, message: str, code: str = "server_error") -> list[Event]:
        """An `error` event and `response.failed`, for a stream that broke mid-way."""
        events = [self._event("error", code=code, message=message, param=None)]
        events += self._close("incomplete")
        self.response = {
            **self.response,
            "status": "failed",
            "output": self.output,
            "completed_at": None,
            "error": {"code": "server_error", "message": message},
        }
        events.append(self._event("response.failed", response=self.response))
        return events

    def _open_item(self, item: dict[str, Any]) -> list[Event]:
        events = self._close("completed")
        index = len(self.output)
        self.output.append(item)
        self._open = index
        announced = {**item, "content": []} if "content" in item else item
        events.append(self._event("response.output_item.added", output_index=index, item=announced))
        if item["type"] in _TEXT_EVENTS:
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=item["content"][0],
                )
            )
        return events

    def _text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self.output[self._open]["type"] != kind:
            make = items.message_item if kind == "message" else items.reasoning_item
            events += self._open_item(make("", "in_progress"))
        assert self._open is not None
        item = self.output[self._open]
        item["content"][0]["text"] += text
        prefix, extra = _TEXT_EVENTS[kind]
        events.append(
            self._event(
                prefix + ".delta",
                item_id=item["id"],
                output_index=self._open,
                content_index=0,
                delta=text,
                **extra,
            )
        )
        return events

    def _call(self, entry: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        fn = entry.get("function") or {}
        if "id" in entry:  # a new call: its name comes first, with arguments ""
            item = items.function_call_item(entry["id"], fn["name"], "", "in_progress")
            events += self._open_item(item)
            self._calls[entry["index"]] = len(self.output) - 1
        fragment = fn.get("arguments") or ""
        if fragment:
            index = self._calls[entry["index"]]
            item = self.output[index]
            item["arguments"] += fragment
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=fragment,
                )
            )
        return events

    def _close(self, status: str) -> list[Event]:
        """The `.done` events of the open item."""
        if self._open is None:
            return []
        index, self._open = self._open, None
        item = self.output[index]
        events: list[Event] = []
        if item["type"] in _TEXT_EVENTS:
            prefix, extra = _TEXT_EVENTS[item["type"]]
            part = item["content"][0]
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(self._event(prefix + ".done", **common, text=part["text"], **extra))
            events.append(self._event("response.content_part.done", **common, part=part))
        elif item["type"] == "function_call":
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        item["status"] = status
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events
