"""The stored responses of `/v1/responses` (API process, in memory, bounded).

OpenAI stores responses by default (`store: true`) so that `GET /v1/responses/{id}` and a later
turn's `previous_response_id` find them. This server keeps the newest `capacity` of them in
memory (least recently used go first; nothing survives a restart): each entry is the `Response`
object, its input items, and the whole conversation as chat messages (input history, new input,
reply), so a follow-up turn's prompt is that conversation plus its new input and shares its
prefix in the radix cache. Only the uvicorn event loop touches the store, so it needs no lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from radixgen.runtime.entrypoints.http_utils import NotFoundError

DEFAULT_CAPACITY = 4096


class ResponseNotFoundError(NotFoundError):
    """404 for a response id that is not stored (never was, deleted, or evicted); `param` names
    the request field that held it (`previous_response_id`), as OpenAI's error does."""

    def __init__(self, response_id: str, param: str | None = None) -> None:
        super().__init__(f"Response with id '{response_id}' not found.")
        self.param = param


@dataclass
class StoredResponse:
    response: dict[str, Any]
    conversation: list[dict[str, Any]]  # chat messages, without the instructions
    input_items: list[dict[str, Any]]  # this turn's input, as GET .../input_items lists it


class ResponseStore:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(
        self,
        response: dict[str, Any],
        conversation: list[dict[str, Any]],
        input_items: list[dict[str, Any]] | None = None,
    ) -> None:
        rid = response["id"]
        self._items[rid] = StoredResponse(response, conversation, input_items or [])
        self._items.move_to_end(rid)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response, or a 404 in OpenAI's error shape naming `param`."""
        entry = self._items.get(response_id)
        if entry is None:
            raise ResponseNotFoundError(response_id, param)
        self._items.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> None:
        if self._items.pop(response_id, None) is None:
            raise ResponseNotFoundError(response_id)
