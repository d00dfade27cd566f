"""Jump-forward: boundary re-tokenization, grammar consistency, limits, and when it must not happen."""

from __future__ import annotations

import time

import pytest
from grammar_helpers import VOCAB_SIZE, make_req, mask_of

from radixgen.runtime.constrained.grammar_manager import GrammarManager, JumpForwardEdit
from radixgen.runtime.constrained.jump_forward import plan_jump_forward
from radixgen.server_args import GrammarConfig

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


class EditRecorder:
    """Applies jump-forward edits to a request's output as the scheduler does (no KV here)."""

    def __init__(self, context_length: int = 8192) -> None:
        self.context_length = context_length
        self.edits: list[JumpForwardEdit] = []

    def apply(self, req, edit: JumpForwardEdit) -> None:
        self.edits.append(edit)
        del req.output_ids[edit.keep :]
        req.output_ids.extend(edit.tokens)
        req.jump_forward_tokens += edit.added


@pytest.fixture(scope="module", params=["xgrammar", "outlines", "llguidance"])
def manager(request, tokenizer):
    gm = GrammarManager(GrammarConfig(grammar_backend=request.param), tokenizer, VOCAB_SIZE, [2])
    yield gm
    gm.shutdown()


def ready_req(gm, rid="r", **sampling):
    req = make_req(rid, **sampling)
    gm.submit(req)
    deadline = time.monotonic() + 30
    while True:
        ready, failed = gm.poll([req])
        assert not failed, req.finished_reason
        if ready:
            return req
        assert time.monotonic() < deadline
        time.sleep(0.002)


def sample(gm, req, sched, token_id):
    """What the scheduler does with a sampled token."""
    req.output_ids.append(token_id)
    gm.accept(req, token_id)
    if not req.finished:
        sp = req.sampling_params
        max_len = min(sp.max_new_tokens, sched.context_length - len(req.origin_input_ids)) - 1
        edit = gm.jump_forward(req, max_len)
        if edit is not None:
            sched.apply(req, edit)


def test_brace_is_retokenized_with_the_forced_key(manager, tokenizer, encode):
    req, sched = ready_req(manager, json_schema=PERSON), EditRecorder()
    sample(manager, req, sched, encode("{")[0])
    text = tokenizer.decode(req.output_ids)
    assert text.startswith('{"name"') and req.output_ids[0] == encode('{"')[0]  # `{` merged away
    assert sched.edits[0].keep == 0, "the sampled `{` is replaced, not kept"
    # one sampled token was replaced: every other token of the edit came without a model step
    assert req.jump_forward_tokens == sched.edits[0].added == len(req.output_ids) - 1 > 0
    # the matcher now stands exactly where a fresh walk over the new tokens stands
    fresh = manager.backend.create_grammar(manager.cache.get(req.grammar_key).result())
    assert fresh.accept_tokens(req.output_ids) == len(req.output_ids)
    assert (mask_of(fresh) == mask_of(req.grammar)).all()


def test_whole_object_walk_with_jumps_stays_valid(manager, tokenizer, encode):
    req, sched = ready_req(manager, json_schema=PERSON), EditRecorder()
    target = '{"name":"Bob","age":42}'
    while tokenizer.decode(req.output_ids) != target:
        done = tokenizer.decode(req.output_ids)
        assert target.startswith(done), done
        sample(manager, req, sched, encode(target[len(done) :])[0])
    sample(manager, req, sched, 2)
    assert req.grammar.is_terminated()
    assert manager.stats().jump_forward_tokens >= 4


def test_choice_tail_is_forced(manager, tokenizer, encode):
    req, sched = ready_req(manager, choices=["positive", "negative"]), EditRecorder()
    sample(manager, req, sched, encode("neg")[0])
    assert tokenizer.decode(req.output_ids) == "negative"


def test_no_jump_when_disabled_or_logprobs_wanted(tokenizer, encode):
    gm = GrammarManager(GrammarConfig(disable_jump_forward=True), tokenizer, VOCAB_SIZE, [2])
    try:
        req, sched = ready_req(gm, json_schema=PERSON), EditRecorder()
        sample(gm, req, sched, encode("{")[0])
        assert req.output_ids == encode("{") and not sched.edits
    finally:
        gm.shutdown()


def test_no_jump_with_logprobs(manager, encode):
    req, sched = ready_req(manager, json_schema=PERSON), EditRecorder()
    req.return_logprob = True
    sample(manager, req, sched, encode("{")[0])
    assert req.output_ids == encode("{") and not sched.edits


def test_jump_is_truncated_before_max_new_tokens(manager, encode):
    long_key = {
        "type": "object",
        "properties": {"a_very_long_property_name_here": {"type": "integer"}},
    }
    long_key["required"] = ["a_very_long_property_name_here"]
    req, sched = ready_req(manager, json_schema=long_key, max_new_tokens=4), EditRecorder()
    sample(manager, req, sched, encode("{")[0])
    assert len(req.output_ids) <= 3, "one token must be left for the model to sample"


def _at(manager, req, text, encode):
    """Put `req` at `text` as if the model had produced its canonical tokens."""
    req.output_ids[:] = encode(text)
    req.grammar = manager.backend.create_grammar(manager.cache.get(req.grammar_key).result())
    assert req.grammar.accept_tokens(req.output_ids) == len(req.output_ids)


def test_jump_keeps_tokens_shared_with_the_cache(manager, encode):
    req, sched = ready_req(manager, json_schema=PERSON), EditRecorder()
    _at(manager, req, '{"name":"Bob', encode)
    req.cache_protected_len = len(req.origin_input_ids) + len(req.output_ids)  # all cached
    kept = len(req.output_ids)
    sample(manager, req, sched, encode('","')[0])
    assert sched.edits, "the forced key should have been appended"
    assert sched.edits[-1].keep >= kept


def test_no_jump_into_a_stop_string(manager, encode):
    req, sched = ready_req(manager, json_schema=PERSON, stop=["age"]), EditRecorder()
    _at(manager, req, '{"name":"Bob', encode)
    sample(manager, req, sched, encode('","')[0])  # the grammar now forces `age":`
    assert not sched.edits and b"age" not in manager.vocab.join(req.output_ids)


def test_plan_flags_a_tail_token_that_could_grow(vocab, encode):
    # `":` is a prefix of a longer token (`":"`): whether it may end the tail depends on the grammar
    assert vocab.longer_tokens(encode('":')[0]) == (encode('":"')[0],)
    plan = plan_jump_forward(encode('{"name":"Bob","'), 'age":', vocab, 0, 100)
    assert plan is not None and plan.last_may_grow
    assert vocab.join(plan.tokens).endswith(b'age":')
    plan = plan_jump_forward(encode('{"'), 'name":"', vocab, 0, 100)
    assert plan is not None and not plan.last_may_grow  # nothing extends `":"`


def test_tail_token_kept_only_when_the_grammar_forbids_longer_ones(manager, tokenizer, encode):
    # after `"age` an integer follows: `":"` is impossible, so `":` may end the jump
    req, sched = ready_req(manager, json_schema=PERSON), EditRecorder()
    _at(manager, req, '{"name":"Bob', encode)
    sample(manager, req, sched, encode('","')[0])
    assert tokenizer.decode(req.output_ids) == '{"name":"Bob","age":'
    # an array of strings may start with `["`: the forced `[` is left to the model
    tags = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
    }
    tags["required"] = ["tags"]
    before = manager.stats().jump_forward_tail_tokens_left
    req, sched = ready_req(manager, json_schema=tags), EditRecorder()
    sample(manager, req, sched, encode("{")[0])
    assert tokenizer.decode(req.output_ids) == '{"tags":'
    assert manager.stats().jump_forward_tail_tokens_left == before + 1


def test_plan_never_drops_sampled_text_or_adds_nothing(vocab, encode):
    assert plan_jump_forward(encode("ab"), "", vocab, 0, 100) is None
    assert plan_jump_forward(encode('{"'), 'name":', vocab, 0, 1) is None  # no room left
    out = [*encode('{"a":"x'), 1]  # a special token closes the window
    plan = plan_jump_forward(out, '"}', vocab, 0, 100)
    assert plan is None or plan.keep >= len(out)
