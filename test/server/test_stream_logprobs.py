"""Streamed logprobs never drop an entry (issue 15): every chunk of native /generate and OpenAI
chat/completions streaming carries the logprob entries of exactly the tokens it adds, and the
chunks together carry the non-streamed request's entries. (The SGLang frontend's
text_async_iter: test_sglang_frontend.py.)"""

from __future__ import annotations

import json

import httpx
import pytest

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Count: 1, 2, 3,"
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


def _stream(http: httpx.Client, body: dict) -> list[dict]:
    with http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[5:]) for line in lines[:-1]]


def _check_chunks(chunks: list[dict], final: dict) -> None:
    """Per chunk: its entries are those of the tokens it adds, and it adds text (or finishes);
    together: the non-streamed entries (same tokens, same values)."""
    entries: list[list] = []
    prev_tokens, prev_text = 0, ""
    for c in chunks:
        meta = c["meta_info"]
        added = meta["output_token_logprobs"]
        assert len(added) == meta["completion_tokens"] - prev_tokens
        assert meta["output_token_logprobs_length"] == meta["completion_tokens"]
        assert [tid for _, tid, _ in added] == c["output_ids"][prev_tokens:]
        assert c["text"].startswith(prev_text)
        assert c["text"] != prev_text or meta["finish_reason"] is not None, "a chunk without text"
        entries += added
        prev_tokens, prev_text = meta["completion_tokens"], c["text"]
    expected = final["meta_info"]["output_token_logprobs"]
    assert [e[1:] for e in entries] == [e[1:] for e in expected]
    assert [e[0] for e in entries] == pytest.approx([e[0] for e in expected], abs=1e-4)
    assert prev_text == final["text"]


def test_native_stream_chunks_carry_their_tokens_logprobs(http):
    body = {"text": PROMPT, "sampling_params": GREEDY, "return_logprob": True,
            "return_text_in_logprobs": True}  # fmt: skip
    final = http.post("/generate", json=body).json()
    chunks = _stream(http, body)
    assert len(chunks) >= 4, "streamed step by step"
    _check_chunks(chunks, final)


def test_a_token_whose_text_is_held_back_goes_out_with_the_next_one(http):
    """Deterministic two-tokens-in-one-chunk case: a stop string that begins with the first
    token's text (and never matches) holds that text back, so the first chunk carries the first
    two tokens, with both their entries (no chunk goes out with a token and no text)."""
    body = {"text": PROMPT, "sampling_params": GREEDY, "return_logprob": True,
            "return_text_in_logprobs": True}  # fmt: skip
    first_text = http.post("/generate", json=body).json()["meta_info"]["output_token_logprobs"]
    first_text = first_text[0][2]
    assert first_text, "the first greedy token has text"
    body["sampling_params"] = {**GREEDY, "stop": [first_text + "\u2603"]}  # a snowman: no match
    final = http.post("/generate", json=body).json()
    chunks = _stream(http, body)
    first = chunks[0]["meta_info"]
    assert first["completion_tokens"] >= 2 and len(first["output_token_logprobs"]) >= 2
    _check_chunks(chunks, final)


def test_openai_chat_stream_logprobs_add_up_to_the_response(oai):
    args = {
        "model": MODEL, "messages": [{"role": "user", "content": "Count from 1 to 20."}],
        "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 2,
    }  # fmt: skip
    whole = oai.chat.completions.create(**args)
    streamed, usage = [], None
    for chunk in oai.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content:
                streamed += choice.logprobs.content
    expected = whole.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in expected]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in expected], abs=1e-4)
    assert all(len(e.top_logprobs) == 2 for e in streamed)
    assert usage is not None and len(streamed) == usage.completion_tokens


def test_openai_completions_stream_logprobs_and_offsets_continue(oai):
    args = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
            "logprobs": 2}  # fmt: skip
    whole = oai.completions.create(**args).choices[0].logprobs
    tokens, offsets, values = [], [], []
    for chunk in oai.completions.create(**args, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.tokens:
                tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset
                values += choice.logprobs.token_logprobs
    assert tokens == whole.tokens
    assert offsets == whole.text_offset, "offsets continue from chunk to chunk"
    assert values == pytest.approx(whole.token_logprobs, abs=1e-4)
