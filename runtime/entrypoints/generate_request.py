"""Parse and check the body of SGLang's native `POST /generate` into a `GenerateReqInput`.

The shape follows SGLang's /generate contract: `text` or `input_ids`, single or batch,
`sampling_params` as one object or one per item, explicit nulls accepted. Keys SGLang knows but
this server does not do are accepted while unset (null / false / empty) and refused otherwise;
unknown keys are refused, naming the key.
"""

from __future__ import annotations

from collections.abc import Callable

from radixgen.errors import InvalidRequestError
from radixgen.io_struct import GenerateReqInput
from radixgen.program_trace import FIELD as TRACE_FIELD
from radixgen.program_trace import parse_program_trace

_CORE_KEYS = {
    "text",
    "input_ids",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "rid",
    "stream",
    "priority",  # SGLang's request priority (--enable-priority-scheduling)
    "lora_path",  # the LoRA adapter by name (--enable-lora; the TokenizerManager checks it)
    "pin_prefix",  # radixgen's own: keep the prompt in HiCache's host tier (a DSL prefix hint)
    TRACE_FIELD,  # radixgen's own: a traced DSL program's call (radixgen/program_trace.py)
}
# SGLang request keys this server accepts only while they are unset.
_UNSUPPORTED_KEYS = {
    "image_data": "multimodal input",
    "video_data": "multimodal input",
    "audio_data": "multimodal input",
    "modalities": "multimodal input",
    "mm_hashes": "multimodal input",
    "images_config": "multimodal input",
    "input_embeds": "input embeddings",
    "token_ids_logprob": "token_ids_logprob",
    "return_hidden_states": "hidden states",
    "return_routed_experts": "routed experts",
    "session_params": "sessions",
    "session_id": "sessions",
    "custom_logit_processor": "custom logit processors",
    "bootstrap_host": "disaggregation",
    "bootstrap_port": "disaggregation",
    "bootstrap_room": "disaggregation",
    "require_reasoning": "reasoning parsing",
    "max_thinking_tokens": "reasoning budgets",
    "background": "background responses",
    "return_bytes": "byte-level outputs",
    "return_entropy": "entropy outputs",
}
# Accepted and ignored: routing and bookkeeping hints that change no output here.
_IGNORED_KEYS = {
    "extra_key",
    "cache_salt",
    "routing_key",
    "decode_tp_size",
    "disagg_prefill_dp_rank",
    "custom_labels",
    "log_metrics",
    "return_prompt_token_ids",
    "kv_hints",
    "routed_experts_start_len",
    "return_sampling_mask",
    "no_logs",
    "conversation_id",
}
# NOTE: the SGLang router forwards /generate as its own typed request: `model` (null unless the
# client gave one), `log_metrics`, `no_logs` and the unset flags above on every call. One model is
# served, so `model` picks nothing; like the OpenAI routes, any name is accepted.
_MODEL_KEY = "model"
# the replica a request must run on: SGLang's newer name first (the router's dp-aware mode sets
# `data_parallel_rank`); TokenizerManager checks the range against --dp-size
_DP_RANK_KEYS = ("routed_dp_rank", "data_parallel_rank")


def _is_unset(value: object) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_per_item(name: str, value: object, ok: Callable[[object], object], what: str) -> None:
    """The value's type, or each entry's when it is a per-item list (whose length
    `GenerateReqInput.check_per_item_lengths` checks)."""
    for item in value if isinstance(value, list) else [value]:
        if item is not None and not ok(item):
            raise InvalidRequestError(f"{name} must be {what}, got {item!r}", name)


def parse_generate_request(body: object) -> GenerateReqInput:
    """Validate a /generate body; errors are `InvalidRequestError`s that name the field."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", None)
    for key, value in body.items():
        if key in _CORE_KEYS or key in _IGNORED_KEYS or key in _DP_RANK_KEYS:
            continue
        if key == _MODEL_KEY:
            if value is not None and not isinstance(value, str):
                raise InvalidRequestError("model must be a string", key)
            continue
        what = _UNSUPPORTED_KEYS.get(key)
        if what is None:
            raise InvalidRequestError(f"unknown field '{key}' in the /generate request", key)
        if not _is_unset(value):
            raise InvalidRequestError(f"{what} ({key}) is not supported by this server", key)

    text = body.get("text")
    input_ids = body.get("input_ids")
    if text is not None:
        if isinstance(text, list):
            if not text or not all(isinstance(t, str) for t in text):
                raise InvalidRequestError(
                    "text must be a string or a non-empty list of strings", "text"
                )
        elif not isinstance(text, str):
            raise InvalidRequestError("text must be a string or a list of strings", "text")
    if input_ids is not None:
        if not isinstance(input_ids, list) or not input_ids:
            raise InvalidRequestError(
                "input_ids must be a non-empty list of token ids or of lists of token ids",
                "input_ids",
            )
        if isinstance(input_ids[0], list):
            if not all(isinstance(row, list) and all(map(_is_int, row)) for row in input_ids):
                raise InvalidRequestError(
                    "input_ids must be lists of integer token ids", "input_ids"
                )
        elif not all(map(_is_int, input_ids)):
            raise InvalidRequestError("input_ids must be a list of integer token ids", "input_ids")
    if text is not None and input_ids is not None:
        raise InvalidRequestError("give either text or input_ids, not both", "text")
    if text is None and input_ids is None:
        raise InvalidRequestError("a prompt is required: text or input_ids", "text")

    sp = body.get("sampling_params")
    _check_per_item("sampling_params", sp, lambda v: isinstance(v, dict), "an object")
    _check_per_item(
        "return_logprob",
        body.get("return_logprob"),
        lambda v: isinstance(v, bool),
        "a boolean",
    )
    _check_per_item("logprob_start_len", body.get("logprob_start_len"), _is_int, "an integer")
    _check_per_item("top_logprobs_num", body.get("top_logprobs_num"), _is_int, "an integer")
    _check_per_item(
        "rid", body.get("rid"), lambda v: isinstance(v, str) and v, "a non-empty string"
    )
    dp_rank = None
    for key in _DP_RANK_KEYS:
        if body.get(key) is not None:
            if not _is_int(body[key]):
                raise InvalidRequestError(f"{key} must be an integer", key)
            dp_rank = dp_rank if dp_rank is not None else body[key]
    _check_per_item(
        "lora_path", body.get("lora_path"), lambda v: isinstance(v, str) and v, "an adapter name"
    )
    priority = body.get("priority")
    if priority is not None and not _is_int(priority):
        raise InvalidRequestError(f"priority must be an integer, got {priority!r}", "priority")
    for flag in ("stream", "return_text_in_logprobs", "pin_prefix"):
        if body.get(flag) is not None and not isinstance(body[flag], bool):
            raise InvalidRequestError(f"{flag} must be a boolean", flag)

    obj = GenerateReqInput(
        text=text,
        input_ids=input_ids,
        sampling_params=sp,
        return_logprob=body.get("return_logprob") or False,
        logprob_start_len=body.get("logprob_start_len"),
        top_logprobs_num=body.get("top_logprobs_num"),
        return_text_in_logprobs=bool(body.get("return_text_in_logprobs")),
        rid=body.get("rid"),
        stream=bool(body.get("stream")),
        data_parallel_rank=dp_rank,
        program_trace=parse_program_trace(body.get(TRACE_FIELD)),
        priority=priority,
        lora_path=body.get("lora_path"),
        pin_prefix=bool(body.get("pin_prefix")),
    )
    obj.check_per_item_lengths()
    return obj
