"""What the scheduler streams with logprobs: every message carries one entry per token it adds,
also when a message carries several tokens (stream_interval > 1, a retraction)."""

from __future__ import annotations

import time

from toy_runner import make_scheduler, reference_output

from radixgen.io_struct import TokenizedGenerateReq
from radixgen.sampling_params import SamplingParams

PROMPT = [4, 8, 15, 16, 23, 42, 7, 3]


def _submit(s, rid: str, max_new_tokens: int, top: int = 0, prompt: list[int] = PROMPT) -> None:
    sp = SamplingParams.from_dict({"max_new_tokens": max_new_tokens, "temperature": 0})
    s.add_request(
        TokenizedGenerateReq(rid, list(prompt), sp, return_logprob=True, top_logprobs_num=top,
                             stream=True, arrival_time=time.time())
    )  # fmt: skip


def _messages(s, rid: str = "r") -> list[tuple[list[int], list, list | None]]:
    """(new tokens, their logprob entries, their top rows) of each message for `rid`, until idle."""
    out = []
    while s.has_work:
        for batch in s.step():
            for d in batch.deltas:
                if d.rid == rid:
                    out.append((d.new_token_ids, d.output_token_logprobs, d.output_top_logprobs))
    return out


def test_messages_of_several_tokens_carry_every_entry():
    s, _ = make_scheduler(stream_interval=3)
    _submit(s, "r", max_new_tokens=10, top=2)
    messages = _messages(s)
    # the first token at once (time to first token), then three decode steps per message
    assert [len(tokens) for tokens, _, _ in messages] == [1, 3, 3, 3]
    for tokens, entries, tops in messages:
        assert [tid for _, tid in entries] == tokens
        assert tops is not None and len(tops) == len(tokens)
    assert [t for tokens, _, _ in messages for t in tokens] == reference_output(PROMPT, 10)


def test_a_retracted_request_streams_on_without_a_missing_or_repeated_entry():
    s, _ = make_scheduler(pool_tokens=160)
    prompts = {f"r{i}": [i + 1, *PROMPT, *range(1, 13 + i)] for i in range(4)}
    for rid, prompt in prompts.items():
        _submit(s, rid, max_new_tokens=40, prompt=prompt)
    messages = _messages(s, "r3")  # the newest: retracted first
    assert s.stats.retractions > 0
    for tokens, entries, _ in messages:
        assert [tid for _, tid in entries] == tokens
    assert [t for tokens, _, _ in messages for t in tokens] == reference_output(prompts["r3"], 40)
