"""N-gram speculative decoding on the real default model: greedy (and seeded sampled) outputs
identical to decoding without it (bf16 rows are batch-invariant, so verify rows equal decode rows bitwise), for
prompts whose answers quote them (drafts accepted) and ones that do not, plain, constrained
(JSON schema, with jump-forward), with logprobs, stop strings, n > 1 and streaming, all in one
batch; the acceptance counters are reported in /server_info.
"""

from __future__ import annotations

import json

import pytest

import radixgen

pytestmark = pytest.mark.slow  # two Engines on the real model

PASSAGE = (
    "The lighthouse at Cape Morrow was built in 1871 from granite quarried on the island. Its "
    "lamp burned whale oil until 1903, then kerosene, and since 1952 it has run on electricity. "
    "The keeper's cottage now houses a small museum of shipwrecks along the northern coast."
)
DOC = " ".join(
    f"Record {i}: customer {name} from {city} ordered {i + 2} boxes of {item}."
    for i, (name, city, item) in enumerate(
        [("Alice Brown", "Leeds", "tea"), ("Omar Haddad", "Lyon", "soap"),
         ("Mei Chen", "Osaka", "paper"), ("Lars Berg", "Bergen", "salt")] * 3
    )
)  # fmt: skip
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
    "required": ["name", "city"],
}


def _cases(chat_prompt) -> list[tuple[str, dict]]:
    g = {"temperature": 0, "max_new_tokens": 48}
    return [
        (
            chat_prompt(f"Repeat this passage word for word:\n{PASSAGE}"),
            {**g, "max_new_tokens": 80},
        ),
        (chat_prompt(f"{DOC}\nQuote the record about Mei Chen exactly."), g),
        (chat_prompt("Write a haiku about the sea."), g),
        (chat_prompt("List three primary colors."), {**g, "stop": [","]}),
        (chat_prompt(f"Repeat: {PASSAGE}"), {**g, "max_new_tokens": 7}),
        (
            chat_prompt(f"{DOC}\nGive the name and city of record 5 as JSON."),
            {**g, "json_schema": json.dumps(SCHEMA)},
        ),
        (chat_prompt(f"Repeat: {PASSAGE}"), {**g, "n": 2}),
    ]


@pytest.fixture(scope="module")
def outputs(chat_prompt):
    """{spec on/off: (batched outputs, one by one, logprob output, stream chunks, server info,
    a sampled output)}."""
    cases = _cases(chat_prompt)
    prompts = [p for p, _ in cases]
    params = [sp for _, sp in cases]
    lp_prompt = chat_prompt(f"Repeat this passage word for word:\n{PASSAGE}")
    result = {}
    for on in (False, True):
        # NOTE: the fixed cost rule: the default one learns from measured step times, so how
        # much it drafts (and the chunk count asserted below) would follow the machine's load
        flags = (
            {"speculative_algorithm": "NGRAM", "speculative_break_even_tokens": 16} if on else {}
        )
        with radixgen.Engine(
            max_total_tokens=8192, log_level="warning", debug_invariants=on, **flags
        ) as eng:
            batched = eng.generate(prompts, params)
            one_by_one = [
                eng.generate(p, sp) for p, sp in zip(prompts[:3], params[:3], strict=True)
            ]
            lp = eng.generate(
                lp_prompt, {"temperature": 0, "max_new_tokens": 40},
                return_logprob=True, top_logprobs_num=3,
            )  # fmt: skip
            chunks = list(
                eng.generate(lp_prompt, {"temperature": 0, "max_new_tokens": 60}, stream=True)
            )
            sampled = eng.generate(
                lp_prompt, {"temperature": 0.7, "seed": 3, "max_new_tokens": 30, "top_p": 0.9},
                return_logprob=True,
            )  # fmt: skip
            info = eng.get_server_info()["internal_states"][0]
        result[on] = (batched, one_by_one, lp, chunks, info, sampled)
    return result


def _key(out: dict) -> tuple:
    meta = out["meta_info"]
    return out["text"], out["output_ids"], meta["finish_reason"], meta["completion_tokens"]


def test_greedy_outputs_are_identical_with_speculation(outputs):
    (base, base_one, *_), (spec, spec_one, *_) = outputs[False], outputs[True]
    assert len(base) == len(spec)
    for i, (b, s) in enumerate(zip(base, spec, strict=True)):
        assert _key(b) == _key(s), f"case {i}"
    for b, s in zip(base_one, spec_one, strict=True):
        assert _key(b) == _key(s)
    json.loads(spec[5]["text"])  # the constrained output is valid JSON
    assert spec[3]["meta_info"]["finish_reason"] == base[3]["meta_info"]["finish_reason"]


def test_logprobs_and_streaming_are_the_same(outputs):
    base_lp, spec_lp = outputs[False][2], outputs[True][2]
    assert _key(base_lp) == _key(spec_lp)
    b_meta, s_meta = base_lp["meta_info"], spec_lp["meta_info"]
    b_tok = [t for _, t, *_ in b_meta["output_token_logprobs"]]
    s_tok = [t for _, t, *_ in s_meta["output_token_logprobs"]]
    assert b_tok == s_tok
    for (bl, *_), (sl, *_) in zip(
        b_meta["output_token_logprobs"], s_meta["output_token_logprobs"], strict=True
    ):
        assert bl == pytest.approx(sl, abs=1e-5)
    b_top = [[t for _, t, *_ in row] for row in b_meta["output_top_logprobs"]]
    s_top = [[t for _, t, *_ in row] for row in s_meta["output_top_logprobs"]]
    assert b_top == s_top
    base_chunks, spec_chunks = outputs[False][3], outputs[True][3]
    assert base_chunks[-1]["text"] == spec_chunks[-1]["text"]
    assert len(spec_chunks) < len(base_chunks)  # several verified tokens per chunk


def test_acceptance_is_reported(outputs):
    info = outputs[True][4]
    assert info["spec_verified_requests"] > 0
    assert info["spec_accept_length"] > 1.5  # the quoting prompts accept long drafts
    assert outputs[False][4]["spec_verified_requests"] == 0


def test_seeded_sampled_requests_are_identical_too(outputs):
    assert _key(outputs[False][5]) == _key(outputs[True][5])
    for on in (False, True):
        out = outputs[on][5]
        meta = out["meta_info"]
        assert meta["completion_tokens"] == len(out["output_ids"]) > 0
        assert len(meta["output_token_logprobs"]) == len(out["output_ids"])
        assert all(lp is not None and lp <= 0.0 for lp, *_ in meta["output_token_logprobs"])
