"""Pydantic models of the OpenAI-compatible requests (with SGLang's extra sampling fields).

Unknown fields are refused (400 naming the field); fields the official `openai` client may send
but that change nothing here (user, metadata, store, service_tier, ...) are accepted and ignored.
Responses are built as plain dicts and encoded with orjson (no per-response model validation).
"""

from __future__ import annotations

import re
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from radixgen.errors import InvalidRequestError
from radixgen.runtime.entrypoints.openai.json_fields import JSONField, JSONObjectField

_Model = TypeVar("_Model", bound=BaseModel)

TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOP_LOGPROBS = 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SGLangSamplingExtras(_Strict):
    """SGLang's extra sampling / request fields, accepted on both endpoints."""

    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | JSONObjectField | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None  # SGLang extra: stop when the text matches
    no_stop_trim: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    rid: str | None = None
    # SGLang extra: the LoRA adapter by name (else `model` may name one; see adapter_for_model)
    lora_path: str | None = None
    # the data-parallel replica to run on (the SGLang router's dp-aware mode sets it)
    data_parallel_rank: int | None = None
    # accepted for client compatibility; change nothing on this server
    user: str | None = None
    metadata: JSONObjectField | None = None
    store: bool | None = None
    service_tier: str | None = None
    priority: int | None = None
    return_hidden_states: bool = False


class CompletionRequest(SGLangSamplingExtras):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = None
    echo: bool = False
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    max_tokens: int | None = Field(default=16, ge=0)
    n: int = Field(default=1, ge=1)
    presence_penalty: float | None = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    response_format: ResponseFormat | None = None


class FunctionDefinition(_Strict):
    name: str
    description: str | None = None
    parameters: JSONObjectField | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        if not TOOL_NAME_RE.match(v):
            raise ValueError("a function name must be 1-64 characters of a-z, A-Z, 0-9, _ or -")
        return v


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ToolChoiceFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: ToolChoiceFunction


class ToolCallFunction(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction
    index: int | None = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[JSONObjectField] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # fields of a response message that clients echo back into the history
    refusal: str | None = None
    audio: JSONField = None
    function_call: JSONField = None
    annotations: JSONField = None
    reasoning_content: str | None = None


class JsonSchemaSpec(_Strict):
    name: str = "response"
    description: str | None = None
    schema_: JSONObjectField | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class ChatCompletionRequest(SGLangSamplingExtras):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    n: int = Field(default=1, ge=1)
    presence_penalty: float | None = 0.0
    response_format: ResponseFormat | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    chat_template_kwargs: JSONObjectField | None = None
    continue_final_message: bool = False
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    # accepted, no effect on this server
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


CompletionRequest.model_rebuild()


class EmbeddingRequest(_Strict):
    """POST /v1/embeddings: text, a batch of texts, token ids or a batch of them."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    dimensions: int | None = None
    encoding_format: Literal["float", "base64"] = "float"
    # RadixGen extra: cut an input over the model's limit to it instead of a 400
    truncate: bool = False
    user: str | None = None  # accepted for client compatibility; changes nothing


class RerankRequest(_Strict):
    """POST /v1/rerank, in the shape SGLang, Jina and Cohere share."""

    query: str
    documents: list[str] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = True
    truncate: bool = False  # cut a pair over the model's limit to it instead of a 400
    model: str | None = None
    user: str | None = None  # accepted for client compatibility; changes nothing


def parse_request(model: type[_Model], body: object) -> _Model:
    """Validate a body; the first problem becomes a 400 naming the field (dotted path)."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", None)
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = [str(p) for p in err["loc"] if not _is_union_tag(p)]
        field = ".".join(loc) or None
        if err["type"] == "extra_forbidden":
            msg = f"unknown field '{field}'"
        elif err["type"] == "missing":
            msg = f"'{field}' is required"
        else:
            msg = f"{field}: {err['msg']}" if field else err["msg"]
        raise InvalidRequestError(msg, field) from None


def _is_union_tag(part: object) -> bool:
    """pydantic puts the union member it tried ('str', 'list[int]', "literal['a']", a class name)
    into error locations; field names are snake_case identifiers and list indexes are ints."""
    if not isinstance(part, str):
        return False
    return (
        part in ("str", "int", "float", "bool", "dict", "list", "none")
        or any(ch in part for ch in "[(,'")
        or part[:1].isupper()
    )
