"""Pydantic model of a `POST /v1/responses` body (OpenAI's Responses API), API process.

Every field of the openai SDK's `responses.create` is known here, so a field this server cannot
honour gets a 400 that names it and says why (`unsupported_fields`) instead of being dropped
silently; a field no client sends is refused as unknown, as on the other routes. Input items stay
plain dicts: `responses_items.py` reads them and names the offending item in its errors.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from radixgen.errors import InvalidRequestError
from radixgen.json_types import JSONValue
from radixgen.runtime.entrypoints.openai.json_fields import JSONField, JSONObjectField


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TextFormat(_Strict):
    """`text.format`: plain text, any JSON object, or JSON matching `schema` (constrained)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: JSONObjectField | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint; changes nothing here


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None  # we add no obfuscation padding either way


class ResponsesRequest(_Strict):
    model: str | None = None
    input: str | list[JSONObjectField] = Field(default_factory=list)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    tools: list[JSONObjectField] | None = None
    tool_choice: str | JSONObjectField | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    store: bool | None = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    metadata: dict[str, str] | None = None
    # SGLang's request priority (--enable-priority-scheduling), as on chat and completions
    priority: int | None = None
    # accepted for client compatibility; change nothing on this server
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    # known to the openai SDK; refused unless absent or the harmless value (`unsupported_fields`)
    background: bool | None = None
    truncation: str | None = None
    include: list[str] | None = None
    reasoning: JSONObjectField | None = None
    conversation: JSONField = None
    prompt: JSONField = None
    context_management: JSONField = None
    moderation: JSONField = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    prompt_cache_options: JSONField = None
    prompt_cache_retention: str | None = None


# why each refused field cannot be honoured; a field is refused when set to anything but the
# harmless values of `_HARMLESS` (None is always harmless: the SDK omits unset fields)
_WHY = {
    "background": "background responses are not supported (the request runs while it is open)",
    "truncation": "only truncation 'disabled' is supported",
    "include": "no extra output data can be included",
    "reasoning": "reasoning options are not supported by this server",
    "conversation": "conversations are not stored; use previous_response_id",
    "prompt": "stored prompt templates are not supported",
    "context_management": "context management (compaction) is not supported",
    "moderation": "moderation is not supported",
    "max_tool_calls": "max_tool_calls is not supported; parallel_tool_calls=false allows one call",
    "top_logprobs": "logprobs are not supported on /v1/responses; use /v1/chat/completions",
    "prompt_cache_options": "prompt caching is automatic (radix cache) and takes no options",
    "prompt_cache_retention": "prompt caching is automatic (radix cache) and takes no options",
}
_HARMLESS: dict[str, tuple[JSONValue, ...]] = {
    "background": (False,),
    "truncation": ("disabled",),
    "include": ([],),
    "reasoning": ({}, {"effort": None}, {"effort": None, "summary": None}),
    "top_logprobs": (0,),
}


def unsupported_fields(req: ResponsesRequest) -> None:
    """Raise a 400 naming the first field set to something this server cannot do."""
    for name, why in _WHY.items():
        value = getattr(req, name)
        if value is None or value in _HARMLESS.get(name, ()):
            continue
        raise InvalidRequestError(f"'{name}' is not supported: {why}", name)
