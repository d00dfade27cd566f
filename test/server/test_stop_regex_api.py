"""stop_regex end to end (native sampling param, OpenAI extra): the request stops at the step whose
text first matches, SGLang's finish reason names the pattern, the match is trimmed like a stop
string (kept with no_stop_trim), and a stream never shows text that the answer trims.
Bad patterns are 400s: test_hostile_inputs.py."""

from __future__ import annotations

import json
import re

import httpx

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Count: 1, 2, 3,"
GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
NUMBER = r"(?<=\D)\d+"  # a number after a non-digit


def _generate(http: httpx.Client, **sp) -> dict:
    r = http.post("/generate", json={"text": PROMPT, "sampling_params": {**GREEDY, **sp}})
    assert r.status_code == 200, r.text
    return r.json()


def _first_number_at(text: str) -> int:
    found = re.search(r"\d", text)
    assert found is not None and found.start() > 0, text
    return found.start()


def test_native_stop_regex_stops_and_trims_the_match(http):
    full = _generate(http)["text"]
    out = _generate(http, stop_regex=NUMBER)
    assert out["text"] == full[: _first_number_at(full)]
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": NUMBER}
    assert meta["completion_tokens"] < GREEDY["max_new_tokens"]
    # a list: the first pattern that matches ends it
    assert _generate(http, stop_regex=["never here", NUMBER])["text"] == out["text"]


def test_no_stop_trim_keeps_the_match(http):
    full = _generate(http)["text"]
    out = _generate(http, stop_regex=NUMBER, no_stop_trim=True)
    assert full.startswith(out["text"]) and re.search(NUMBER, out["text"]), out["text"]


def test_a_stream_never_shows_the_trimmed_match(http):
    final = _generate(http, stop_regex=NUMBER)
    body = {"text": PROMPT, "stream": True, "sampling_params": {**GREEDY, "stop_regex": NUMBER}}
    with http.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        events = [line[5:] for line in r.iter_lines() if line.startswith("data:")]
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(final["text"].startswith(c["text"]) for c in chunks)
    assert chunks[-1]["text"] == final["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": NUMBER}


def test_openai_stop_regex_extra(oai):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16, "temperature": 0}  # fmt: skip
    whole = oai.chat.completions.create(**chat).choices[0].message.content
    space = re.search(r"\s", whole)
    assert space is not None and space.start() > 0, whole
    choice = oai.chat.completions.create(**chat, extra_body={"stop_regex": r"\s"}).choices[0]
    assert choice.message.content == whole[: space.start()]
    assert choice.finish_reason == "stop" and choice.matched_stop == r"\s"
    args = {"model": MODEL, "prompt": PROMPT, **{"max_tokens": 16, "temperature": 0}}
    done = oai.completions.create(**args, extra_body={"stop_regex": NUMBER}).choices[0]
    streamed = "".join(
        c.choices[0].text
        for c in oai.completions.create(**args, stream=True, extra_body={"stop_regex": NUMBER})
        if c.choices
    )
    assert streamed == done.text and done.matched_stop == NUMBER
