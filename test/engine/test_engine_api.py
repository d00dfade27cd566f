"""The offline Engine's API on the real default model: shapes, sampling, stops, logprobs, streaming, errors."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from wait_helpers import wait_until

import radixgen
from radixgen.errors import InvalidRequestError
from radixgen.kernels.cpu import load_native_kernels
from radixgen.runtime.model_executor.resolution import cpu_has_bf16

pytestmark = pytest.mark.slow  # starts an Engine (real model, real processes)


@pytest.fixture(scope="module")
def engine():
    with radixgen.Engine(
        grammar_backend="none", chunked_prefill_size=128, log_level="warning"
    ) as eng:
        yield eng


GREEDY = {"temperature": 0, "max_new_tokens": 16}


def test_single_and_batch_shapes(engine, chat_prompt):
    one = engine.generate(chat_prompt("What is the capital of France?"), GREEDY)
    assert isinstance(one, dict)
    assert "Paris" in one["text"]
    meta = one["meta_info"]
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] == len(one["output_ids"])

    prompts = [chat_prompt("Say hi."), chat_prompt("What is the capital of France?")]
    many = engine.generate(prompts, [{"temperature": 0, "max_new_tokens": 4}, GREEDY])
    assert isinstance(many, list) and len(many) == 2
    assert many[1]["text"] == one["text"]  # order kept, per-item params honoured
    assert many[0]["meta_info"]["completion_tokens"] <= 4

    ids = engine.tokenizer.encode(prompts[1])
    by_ids = engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert by_ids["output_ids"] == one["output_ids"]
    by_ids_batch = engine.generate(input_ids=[ids, ids], sampling_params=GREEDY)
    assert [o["output_ids"] for o in by_ids_batch] == [one["output_ids"]] * 2


def test_stop_strings_trimmed_and_stop_tokens(engine):
    base = engine.generate(
        "Count: 1, 2, 3, 4, 5, 6,", {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    )
    text = base["text"]
    assert " 9" in text, text
    stopped = engine.generate(
        "Count: 1, 2, 3, 4, 5, 6,", {"temperature": 0, "max_new_tokens": 24, "stop": [" 9"]}
    )
    assert stopped["text"] == text[: text.index(" 9")]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": " 9"}
    # a stop string spanning two tokens (", 8" is at least ',' + ' 8')
    span = engine.generate(
        "Count: 1, 2, 3, 4, 5, 6,", {"temperature": 0, "max_new_tokens": 24, "stop": "7, 8"}
    )
    assert span["text"] == text[: text.index("7, 8")]
    # stop token id: the token itself is not in the text
    ids = base["output_ids"]
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    by_id = engine.generate(
        "Count: 1, 2, 3, 4, 5, 6,",
        {"temperature": 0, "max_new_tokens": 24, "stop_token_ids": [ids[k]]},
    )
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[k]}
    assert by_id["output_ids"] == ids[: k + 1]
    assert by_id["text"] == engine.tokenizer.decode(ids[:k])


def test_eos_min_new_tokens_and_ignore_eos(engine, chat_prompt):
    prompt = chat_prompt("What is the capital of France?")
    natural = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 64})
    assert natural["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    n = natural["meta_info"]["completion_tokens"]
    longer = engine.generate(
        prompt, {"temperature": 0, "max_new_tokens": 64, "min_new_tokens": n + 4}
    )
    assert longer["meta_info"]["completion_tokens"] >= n + 4
    forced = engine.generate(
        prompt, {"temperature": 0, "max_new_tokens": n + 6, "ignore_eos": True}
    )
    assert forced["meta_info"]["finish_reason"] == {"type": "length", "length": n + 6}
    assert len(forced["output_ids"]) == n + 6


def test_prefill_only_and_input_logprobs(engine):
    text = "The capital of France is Paris."
    ids = engine.tokenizer.encode(text)
    out = engine.generate(text, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=2)
    meta = out["meta_info"]
    assert out["output_ids"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
    entries = meta["input_token_logprobs"]
    assert len(entries) == len(ids) - 2
    assert entries[0][0] is None and entries[0][1] == ids[2]
    assert [e[1] for e in entries] == ids[2:]
    assert all(e[0] <= 0 for e in entries[1:])
    # no start given + prefill only: the whole prompt is scored
    whole = engine.generate(text, {"max_new_tokens": 0}, return_logprob=True)
    assert len(whole["meta_info"]["input_token_logprobs"]) == len(ids)
    # the cached prefix must not hide positions that need logprobs
    again = engine.generate(text, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    assert [e[1] for e in again["meta_info"]["input_token_logprobs"]] == ids


def test_output_logprobs_and_top_logprobs(engine, chat_prompt):
    out = engine.generate(
        chat_prompt("Name a color."),
        {"temperature": 0, "max_new_tokens": 6},
        return_logprob=True,
        top_logprobs_num=3,
        return_text_in_logprobs=True,
    )
    meta = out["meta_info"]
    lps = meta["output_token_logprobs"]
    assert [e[1] for e in lps] == out["output_ids"]
    for (lp, tid, txt), top in zip(lps, meta["output_top_logprobs"], strict=True):
        assert len(top) == 3
        assert top[0][1] == tid and abs(top[0][0] - lp) < 1e-5  # greedy picks the top token
        assert top[0][0] >= top[1][0] >= top[2][0]
        assert txt == engine.tokenizer.token_text(tid)


def test_seeded_sampling_is_batch_independent(engine, chat_prompt):
    prompt = chat_prompt("Tell me a short story about a cat.")
    params = {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "max_new_tokens": 24, "seed": 1234}
    assert engine.flush_cache()["success"]
    alone = engine.generate(prompt, params)
    others = [chat_prompt(f"Write a sentence about the number {i}.") for i in range(5)]
    # now the prompt is cached and the batch is chunked differently: still the same tokens
    mixed = engine.generate(
        [*others[:2], prompt, *others[2:]],
        [{"temperature": 1.0, "max_new_tokens": 24}] * 2
        + [params]
        + [{"temperature": 0.7, "max_new_tokens": 30}] * 3,
    )
    assert mixed[2]["output_ids"] == alone["output_ids"]
    other_seed = engine.generate(prompt, {**params, "seed": 99})
    assert other_seed["output_ids"] != alone["output_ids"]
    unfiltered = {"temperature": 0.8, "max_new_tokens": 16, "seed": 7}  # full-vocabulary draw
    first = engine.generate(prompt, unfiltered)
    batched = engine.generate(
        [others[0], prompt], [{"temperature": 0, "max_new_tokens": 20}, unfiltered]
    )
    assert batched[1]["output_ids"] == first["output_ids"]


def test_n_samples(engine, chat_prompt):
    outs = engine.generate(
        chat_prompt("Give me a random animal."), {"temperature": 1.0, "max_new_tokens": 8, "n": 3}
    )
    assert isinstance(outs, list) and len(outs) == 3
    assert len({tuple(o["output_ids"]) for o in outs}) > 1
    # the prompt was prefilled once and shared: the samples report it cached
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs)


def test_streaming_chunks_grow_and_match_final(engine, chat_prompt):
    prompt = chat_prompt("Write two sentences about the moon.")
    final = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 24})
    chunks = list(engine.generate(prompt, {"temperature": 0, "max_new_tokens": 24}, stream=True))
    assert len(chunks) > 3  # one per decode step, not a single burst
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == final["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] is not None
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_async_generate_and_stream(engine, chat_prompt):
    prompt = chat_prompt("What is the capital of France?")

    async def run():
        one = await engine.async_generate(prompt, GREEDY)
        pieces = [c["text"] async for c in await engine.async_generate(prompt, GREEDY, stream=True)]
        both = await asyncio.gather(
            engine.async_generate(prompt, GREEDY), engine.async_generate(prompt, GREEDY)
        )
        return one, pieces, both

    one, pieces, both = asyncio.run(run())
    assert pieces[-1] == one["text"]
    assert [b["text"] for b in both] == [one["text"]] * 2


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"prompt": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"prompt": "hi", "sampling_params": {"temperature": -0.5}}, "temperature"),
        ({"prompt": "hi", "sampling_params": {"bogus_key": 1}}, "bogus_key"),
        ({"prompt": "hi", "sampling_params": {"top_k": 0.5}}, "top_k"),
        ({"prompt": "hi", "sampling_params": {"n": 0}}, "n"),
        ({"prompt": "", "sampling_params": {}}, "text"),
        ({"input_ids": [1, 10**7], "sampling_params": {}}, "input_ids"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": 10**6}}, "max_new_tokens"),
        ({"prompt": "hi", "logprob_start_len": 99, "return_logprob": True}, "logprob_start_len"),
        ({"prompt": "hi", "sampling_params": {"stop_token_ids": [10**9]}}, "stop_token_ids"),
        # the request limits apply offline too (defaults: 16 stops of 128 chars, 1M-char prompts)
        ({"prompt": "hi", "sampling_params": {"stop": ["a"] * 17}}, "stop"),
        ({"prompt": "hi", "sampling_params": {"stop": ["a" * 129]}}, "stop"),
        ({"prompt": "a" * 1_000_001, "sampling_params": {}}, "text"),
    ],
)
def test_bad_input_raises_value_error_naming_the_parameter(engine, kwargs, param):
    with pytest.raises(ValueError) as info:
        engine.generate(**kwargs)
    assert isinstance(info.value, InvalidRequestError)
    assert info.value.param == param
    assert param in str(info.value) or info.value.param in ("text", "input_ids")


def test_over_long_prompt_and_engine_keeps_serving(engine):
    too_long = "word " * 9000
    with pytest.raises(ValueError, match="tokens"):
        engine.generate(too_long, {"max_new_tokens": 4})
    out = engine.generate("Hello", {"max_new_tokens": 2, "ignore_eos": True})
    assert out["meta_info"]["completion_tokens"] == 2


def test_offline_batch_has_no_queue_or_sequence_limit(engine):
    """The server's defaults (256 sequences per request, 128 running + 256 queued) would refuse
    this batch; an offline job submits all its work at once, so the Engine has neither limit."""
    out = engine.generate(["Hi"] * 400, {"max_new_tokens": 0})
    assert len(out) == 400 and all(o["meta_info"]["finish_reason"] for o in out)
    assert engine.server_args.scheduler.max_queued_requests is None


def test_abandoned_stream_is_aborted(engine, chat_prompt):
    it = engine.generate(
        chat_prompt("Write a long essay about rivers."), {"max_new_tokens": 200}, stream=True
    )
    next(it)
    it.close()
    wait_until(
        lambda: engine.get_server_info()["internal_states"][0]["running_requests"] == 0,
        5.0,
        interval=0.1,
        what="the abandoned stream to be aborted",
    )
    assert engine.flush_cache()["success"]


def test_server_info(engine):
    info = engine.get_server_info()
    assert info["max_total_num_tokens"] > 0
    assert info["internal_states"][0]["max_total_num_tokens"] == info["max_total_num_tokens"]
    # what runs, not the flags: the default GGUF stays quantized wherever the native quantized
    # GEMM runs (any ISA variant that has it), with bf16 activations; --dtype auto is bf16 there
    # and where the CPU multiplies bf16 fast (AVX512-BF16 or AMX-BF16), else float32
    native = load_native_kernels()
    kept = native is not None and native.has_quant_gemm
    assert info["quantization"] == ("gguf" if kept else "unquant")
    assert info["dtype"] == ("bfloat16" if kept or cpu_has_bf16() else "float32")
    assert info["kernel_isa"] == (native.isa if native is not None else None)


def test_duplicate_rids_are_refused_before_anything_runs(engine):
    with pytest.raises(InvalidRequestError) as err:
        engine.generate(["Hello", "Hi"], {"max_new_tokens": 2}, rid=["dup", "dup"])
    assert err.value.param == "rid"
    # nothing was sent: the id is free for the next request
    out = engine.generate("Hello", {"max_new_tokens": 2}, rid="dup")
    assert out["meta_info"]["id"] == "dup"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"sampling_params": [{"max_new_tokens": 1}]}, "sampling_params"),
        (
            {"sampling_params": {"max_new_tokens": 1}, "top_logprobs_num": [1, 2]},
            "top_logprobs_num",
        ),
    ],
)
def test_per_item_lists_must_match_the_batch(engine, kwargs, param):
    with pytest.raises(InvalidRequestError) as err:
        engine.generate(["a", "b", "c"], **kwargs)
    assert err.value.param == param


def test_empty_text_is_refused_even_where_encoding_adds_tokens(engine):
    with pytest.raises(InvalidRequestError, match="empty") as err:
        engine.generate("", {"max_new_tokens": 2})
    assert err.value.param == "text"


def test_first_stream_chunk_is_not_held_back_by_stream_interval(engine, chat_prompt):
    params = {"temperature": 0, "max_new_tokens": 9, "ignore_eos": True, "stream_interval": 4}
    counts = [
        c["meta_info"]["completion_tokens"]
        for c in engine.generate(chat_prompt("Count to ten."), params, stream=True)
    ]
    assert counts[0] == 1  # the first token at once (time to first token)
    assert counts[-1] == 9 and all(b - a <= 4 for a, b in itertools.pairwise(counts))
    assert len(counts) < 9  # later chunks are batched


def test_stop_string_spelled_in_byte_tokens_is_found(engine):
    """A byte-level vocabulary can spell one character in several tokens: the stop check must
    decode enough tail tokens (one byte per token at least)."""
    from radixgen.io_struct import TokenizedGenerateReq
    from radixgen.runtime.scheduler.finish import _match_stop_string
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.text.tokenizer import _bytes_to_unicode
    from radixgen.sampling_params import SamplingParams

    tok = engine.tokenizer
    stop = "🦀🦀"
    byte_char = _bytes_to_unicode()
    byte_ids = [tok.token_to_id(byte_char[b]) for b in stop.encode("utf-8")]
    assert None not in byte_ids and tok.decode(byte_ids) == stop
    prompt = tok.encode("Crabs:")
    req = Req(TokenizedGenerateReq("crab", prompt, SamplingParams.from_dict({"stop": stop})), 0)
    req.output_ids = tok.encode(" two crabs") + byte_ids
    assert _match_stop_string(req, tok) == stop
