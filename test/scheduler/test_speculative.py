"""N-gram speculative decoding in the scheduler, on real KV pools with the toy runner.

Outputs with speculation equal the toy model's reference token for token (the toy model reads
every token back through req_to_token, so a draft slot kept by mistake, or a rejected one whose
KV leaks into the next step, changes the outputs), for a model that repeats itself (drafts
accepted) and one that does not (drafts rejected), in mixed batches, with pages, chunking and
pool pressure; `debug_invariants` checks the KV accounting after every step.
"""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from step_helpers import count_steps_in_flight
from toy_runner import VOCAB, make_scheduler, next_token, run_to_end, submit

from radixgen.errors import InvalidRequestError
from radixgen.finish_reason import FinishReason
from radixgen.io_struct import AbortReq, TokenizedGenerateReq
from radixgen.runtime.speculative.draft_tree import CandidateTree, step_draft, walk_grammar
from radixgen.runtime.speculative.ngram import Candidate, NgramIndex, SharedCorpus, continuation
from radixgen.runtime.speculative.policy import (
    NEXT_PRIOR,
    AcceptanceModel,
    NodeOffer,
    RequestAcceptance,
    StepCostModel,
    select_drafts,
    select_nodes,
)
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import ServerArgs

# a fixed cost rule (the toy runner's step times say nothing about a real model's)
SPEC = {
    "speculative_algorithm": "NGRAM",
    "speculative_num_draft_tokens": 6,
    "speculative_break_even_tokens": 16,
}
PERIOD = 11


def copy_model(ids: list[int]) -> int:
    """A model that repeats its last PERIOD tokens (what n-gram drafts predict well)."""
    return ids[-PERIOD] if len(ids) >= PERIOD else 1


def reference(prompt: list[int], n: int, model=next_token) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(model(ids))
    return ids[len(prompt) :]


def prompts(count: int) -> list[list[int]]:
    return [[(7 * i + 3 * j) % (VOCAB - 1) + 1 for j in range(20 + 9 * i)] for i in range(count)]


def run(model, reqs: list[tuple[str, list[int], int]], **flags):
    s, runner = make_scheduler(**flags)
    runner.predict = model
    for rid, prompt, n in reqs:
        submit(s, rid, prompt, max_new_tokens=n)
    return run_to_end(s), s, runner


def test_ngram_index_lists_the_longest_latest_matches_first():
    idx = NgramIndex(1, 3)
    toks = [1, 2, 3, 9, 1, 2, 3, 4, 5, 2, 3]
    # suffix [2, 3]: its latest occurrence (before 4), then the one before 9; then [3]'s others
    assert idx.candidates(toks, 4) == [Candidate(2, 7), Candidate(2, 3)]
    assert continuation(toks, idx.candidates(toks, 1)[0].start, 3) == [4, 5, 2]
    toks += [4]  # grows incrementally: [2, 3, 4] now matches at position 5
    assert idx.candidates(toks, 1) == [Candidate(3, 8)]
    assert idx.candidates(toks, 3) == [Candidate(3, 8)]  # [4] and [3, 4]: the same start
    assert NgramIndex(2, 3).candidates([5, 6, 7], 4) == []  # no earlier [6, 7]
    assert idx.candidates(toks, 0) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=60),
    st.integers(1, 3),
    st.integers(0, 5),
    st.integers(1, 6),
)
def test_candidates_are_every_earlier_match_longest_then_latest(toks, min_n, extra, breadth):
    """Against brute force: every earlier end of the last token, its match length (up to
    max_n), at least min_n, sorted by length then recency, as the index grows token by token."""
    max_n = min_n + extra
    idx = NgramIndex(min_n, max_n)
    for end in range(1, len(toks) + 1):
        seq = toks[:end]
        expect = []
        for e in range(1, end):
            m = 0
            while m < max_n and m < e and seq[e - 1 - m] == seq[end - 1 - m]:
                m += 1
            if m >= min_n and end >= min_n + 1:
                expect.append(Candidate(min(m, end - 1), e))
        expect.sort(key=lambda c: (-c.match, -c.start))
        assert idx.candidates(seq, breadth) == expect[:breadth], (seq, min_n, max_n)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), max_size=6),
    st.lists(st.integers(0, 3), min_size=1, max_size=10),
    st.integers(1, 2),
    st.integers(0, 4),
    st.integers(1, 5),
    st.integers(4, 40),
)
def test_the_shared_corpus_lists_matches_within_the_outputs_it_holds(
    seqs, toks, min_n, extra, breadth, capacity
):
    """Against brute force: the sequences still held (the oldest dropped while the new one would
    not fit), every occurrence of the request's suffix in one of them with a token after it,
    longest then latest first, each with the tokens after it in its own sequence only."""
    max_n, depth = min_n + extra, 3
    corpus = SharedCorpus(capacity, min_n, max_n)
    held: list[list[int]] = []
    for seq in seqs:
        corpus.add(seq)
        seq = seq[-capacity:]
        if seq:
            while held and sum(map(len, held)) + len(seq) > capacity:
                held.pop(0)
            held.append(seq)
    assert len(corpus) == sum(map(len, held))
    expect = []  # (match, order, follow)
    order = 0
    for seq in held:
        for e in range(1, len(seq)):  # an occurrence ending at e, continuing at seq[e]
            order += 1
            m = 0
            while m < min(max_n, len(toks)) and m < e and seq[e - 1 - m] == toks[-1 - m]:
                m += 1
            if m >= max(min_n, 1):
                expect.append((m, order, seq[e : e + depth]))
    expect.sort(key=lambda x: (-x[0], -x[1]))
    got = corpus.candidates(toks, breadth, depth)
    assert [(c.match, c.follow) for c in got] == [(m, f) for m, _, f in expect[:breadth]]


def test_a_request_asked_again_drafts_from_the_first_ones_output():
    """The toy model's answer seldom repeats its prompt, so a request's own tokens draft little;
    the same prompt asked again finds the first answer in the shared corpus (until the flush
    empties it) and verifies it in a few steps."""
    prompt, n = prompts(1)[0], 40
    steps = {}
    for capacity in (0, 4096):
        s, runner = make_scheduler(**SPEC, speculative_ngram_capacity=capacity)
        submit(s, "first", prompt, max_new_tokens=n)
        assert run_to_end(s)["first"][0] == reference(prompt, n)
        before = len(runner.batches)
        submit(s, "again", prompt, max_new_tokens=n)
        assert run_to_end(s)["again"][0] == reference(prompt, n)
        steps[capacity] = len(runner.batches) - before
        # each: its prompt's last 8 tokens (the longest match window), then its output
        assert len(s.draft_models.corpus) == (0 if capacity == 0 else 2 * (8 + n))
        assert s.flush_cache().success and len(s.draft_models.corpus) == 0
    assert steps[4096] <= n // 4 and 2 * steps[4096] < steps[0], steps


def test_a_repeating_suffix_continues_with_its_period():
    toks = [5, 1, 2, 1, 2]
    assert continuation(toks, 3, 5) == [1, 2, 1, 2, 1]  # overlaps the suffix: period 2
    assert continuation(toks, 1, 3) == [1, 2, 1]
    sevens = [7, 7, 7]
    assert continuation(sevens, NgramIndex(1, 4).candidates(sevens, 1)[0].start, 4) == [7] * 4


def test_candidates_merge_into_a_tree_and_chains_cover_it():
    model = AcceptanceModel()
    toks = [1, 2, 3, 9, 1, 2, 3, 4, 5, 2, 3]
    idx = NgramIndex(1, 3)
    tree = CandidateTree.build(toks, idx.candidates(toks, 4), 3, model, RequestAcceptance())
    # [2, 3] was followed by 4 5 2 and by 9 1 2; [3] alone adds nothing new (same starts)
    assert sorted(tree.children[0]) == [4, 9]
    four, nine = tree.children[0][4], tree.children[0][9]
    assert tree.share[four] == tree.share[nine] == 0.5
    assert tree.prob[four] == pytest.approx(model.first_weight(2) * 0.5)
    deeper = tree.children[four][5]
    assert tree.prob[deeper] == pytest.approx(tree.prob[four] * NEXT_PRIOR)
    draft = step_draft(tree, [True] * len(tree), None)
    assert len(draft) == 6 and len(draft.chains) == 2
    assert [draft.tokens[v] for v in draft.chains[0]] in ([4, 5, 2], [9, 1, 2])
    assert draft.walk([draft.tokens[draft.chains[1][0]], -1, -1, -1, -1, -1, -1]) == [
        draft.chains[1][0]
    ]
    # nodes not kept (a cut subtree) leave the chains
    keep = [True] * len(tree)
    keep[nine] = keep[tree.children[nine][1]] = keep[tree.children[tree.children[nine][1]][2]] = (
        False
    )
    small = step_draft(tree, keep, None)
    assert small.chains == [[1, 2, 3]] and small.main == [4, 5, 2]


def test_nodes_are_taken_while_they_raise_tokens_per_millisecond():
    offers = [
        NodeOffer(-0.9 / 1.0, 0.9, 1.0, 0, 1, 0),
        NodeOffer(-0.8 / 1.0, 0.8, 1.0, 0, 2, 1),
        NodeOffer(-0.5 / 1.0, 0.5, 1.0, 1, 1, 0),
        NodeOffer(-0.95 / 1.0, 0.95, 1.0, 1, 2, 7),  # its parent is not on offer
    ]
    taken = select_nodes(offers, tokens=2.0, step_ms=5.0, budget=10)
    # 0.9 > 2/5, 0.8 > 2.9/6, 0.5 < 3.7/7: stop
    assert [(o.owner, o.node) for o in taken] == [(0, 1), (0, 2)]
    assert select_nodes(list(offers), 2.0, 5.0, budget=1)[0].node == 1
    assert select_nodes(list(offers), 2.0, 1.0, budget=10) == []  # rows dear: nothing pays


def test_drafts_pay_for_leaving_the_cuda_graph_or_are_not_taken():
    """A step carrying drafts costs a fixed price more where plain steps replay a CUDA graph
    (issue 36: 1.4 ms replayed, ~10 ms eager on the H200): rare matches no longer pay for it,
    likely ones still do, and without the price the choice is select_nodes'."""

    def offers(p: float) -> list[NodeOffer]:
        return [NodeOffer(-p / 0.1, p, 0.1, 0, 1, 0), NodeOffer(-p * p / 0.1, p * p, 0.1, 0, 2, 1)]

    plain = select_nodes(offers(0.3), tokens=1.0, step_ms=1.4, budget=10)
    assert select_drafts(offers(0.3), 1.0, 1.4, 1.4, budget=10) == plain and len(plain) == 2
    # 1.39 tokens in 10.2 ms lose to 1 token in 1.4 ms; in 1.8 ms they win
    assert select_drafts(offers(0.3), 1.0, 1.4, 10.0, budget=10) == []
    assert len(select_drafts(offers(0.3), 1.0, 1.4, 1.6, budget=10)) == 2
    # likely drafts pay even a large price: 1 + 0.98 + 0.96 tokens in 10.2 ms beat 1 in 7 ms
    assert len(select_drafts(offers(0.98), 1.0, 7.0, 10.0, budget=10)) == 2


def test_acceptance_and_step_cost_models_learn():
    model = AcceptanceModel()
    req = RequestAcceptance()
    before = model.prob(1, 1, 1.0, req)
    for _ in range(200):
        model.observe(1, 1, 1.0, True, req)  # one-token matches always right here
    assert model.prob(1, 1, 1.0, req) > max(before, 0.9)
    cost = StepCostModel(4.5, 0.35, 0.25, learn=True)
    for rows in (1, 2, 5, 9, 1, 3, 12, 1, 7) * 30:
        cost.observe(rows, rows * 2048.0, 2.0 + 0.5 * rows + 0.1 * rows * 2)
    assert cost.base_ms == pytest.approx(2.0, abs=0.2)
    assert cost.row_ms(2048) == pytest.approx(0.5 + 0.2, abs=0.1)


@pytest.mark.parametrize("model", [copy_model, next_token], ids=["repeats", "random"])
@pytest.mark.parametrize(
    "flags", [{}, {"page_size": 4}, {"chunked_prefill_size": 16}, {"disable_radix_cache": True}]
)
def test_outputs_equal_the_reference_in_mixed_batches(model, flags):
    reqs = [(f"r{i}", p, 30 + 7 * i) for i, p in enumerate(prompts(5))]
    out, s, runner = run(model, reqs, **SPEC, **flags)
    for rid, prompt, n in reqs:
        ids, reason = out[rid]
        assert ids == reference(prompt, n, model), rid
        assert reason == FinishReason.length(n)
    st = s.internal_state()
    assert st.speculation.spec_verified_requests > 0
    assert st.counters.generated_tokens == sum(n for *_, n in reqs)
    if model is copy_model:
        assert st.speculation.spec_accept_length > 3.0
        _, _, base_runner = run(model, reqs, **flags)
        assert len(runner.batches) < len(base_runner.batches) / 2  # fewer forward steps
        # a step mixes verify rows, plain decodes and prefills
        assert any(max(b.extend_lens) > 1 and 1 in b.extend_lens for b in runner.batches)
    assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size


def earliest_copy_model(ids: list[int]) -> int:
    """Copies what followed the earliest occurrence of the last token: the latest occurrence's
    continuation (a one-chain draft) is often wrong, an older candidate's (a branch) right."""
    last = ids[-1]
    for j in range(len(ids) - 1):
        if ids[j] == last:
            return ids[j + 1]
    return next_token(ids)


@pytest.mark.parametrize("flags", [{}, {"chunked_prefill_size": 8}, {"disable_radix_cache": True}])
def test_draft_trees_verify_the_branch_the_model_takes(flags):
    # three segments after the same two tokens [7, 1]; the model continues the first one, a
    # one-chain draft proposes the last one (the latest occurrence of the longest match)
    a, b, c = list(range(10, 22)), list(range(22, 34)), list(range(34, 46))
    prompt = [7, 1, *a, 7, 1, *b, 7, 1, *c, 7]
    reqs = [("a", prompt, 14), ("b", [3, *prompt], 13)]
    steps = {}
    for breadth in (1, 4):
        spec = {**SPEC, "speculative_break_even_tokens": 100}  # rows are cheap: branches pay
        out, s, runner = run(
            earliest_copy_model, reqs, speculative_ngram_max_bfs_breadth=breadth, **spec, **flags
        )
        for rid, p, n in reqs:
            assert out[rid][0] == reference(p, n, earliest_copy_model), (breadth, rid)
        st = s.draft_models.stats
        if breadth > 1:
            assert st.spec_branch_tokens > 0 and st.spec_branch_accepted_tokens > 0
            # the branches ran as pseudo-requests (in spare rows, all given back below)
            assert any(len(b.extend_lens) > len(reqs) for b in runner.batches)
        else:
            assert st.spec_branch_tokens == 0
        assert s.req_to_token_pool.available_size() == s.req_to_token_pool.size
        assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size
        steps[breadth] = len(runner.batches)
    assert steps[4] < steps[1]


def test_sampled_requests_draw_the_same_tokens_through_draft_trees():
    a, b, c = list(range(10, 22)), list(range(22, 34)), list(range(34, 46))
    prompt = [7, 1, *a, 7, 1, *b, 7, 1, *c, 7]
    outs = []
    for spec in ({**SPEC, "speculative_break_even_tokens": 100}, {}):
        s, runner = make_scheduler(**spec)
        runner.predict = earliest_copy_model
        for i in range(6):
            submit(s, f"r{i}", prompt, max_new_tokens=24, temperature=0.05 * (i + 1), seed=i)
        outs.append(run_to_end(s))
        if spec:
            assert s.draft_models.stats.spec_branch_accepted_tokens > 0
    assert outs[0] == outs[1]


class NoFives:
    """A grammar that forbids the multiples of 5 (token ids), for the toy vocabulary."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def fill_next_token_bitmask(self, mask: torch.Tensor, row: int) -> None:
        allowed = torch.tensor([t % 5 != 0 for t in range(64)])
        bits = (allowed.view(2, 32).long() << torch.arange(32)).sum(dim=1)
        mask[row] = (bits - (bits >= 2**31) * 2**32).to(torch.int32)

    def accept_token(self, tok: int) -> bool:
        if tok % 5 == 0:
            return False
        self.accepted.append(tok)
        return True

    def rollback(self, n: int) -> None:
        del self.accepted[len(self.accepted) - n :]

    def is_terminated(self) -> bool:
        return False


class NoFivesGrammars:
    """Stands in for the GrammarManager: every constrained request gets a `NoFives` grammar."""

    bitmask_words = 2

    def submit(self, req) -> None:
        pass

    def poll(self, reqs):
        for r in reqs:
            r.grammar = NoFives()
        return list(reqs), []

    def fill_mask(self, reqs):
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        mask = torch.empty((len(rows), 2), dtype=torch.int32)
        for j, i in enumerate(rows):
            reqs[i].grammar.fill_next_token_bitmask(mask, j)
        return mask, torch.tensor(rows, dtype=torch.long)

    def accept(self, req, token_id: int) -> None:
        assert req.grammar.accept_token(token_id)

    def jump_forward(self, req, max_output_len: int):
        return None

    def stats(self) -> dict[str, float]:
        return {}


def test_the_grammar_walk_cuts_forbidden_subtrees_and_restores_the_matcher():
    toks = [1, 2, 3, 9, 1, 2, 3, 4, 5, 2, 3]  # continuations 4 5 2 and 9 1 2
    tree = CandidateTree.build(
        toks, NgramIndex(1, 3).candidates(toks, 4), 3, AcceptanceModel(), RequestAcceptance()
    )
    grammar = NoFives()
    grammar.accepted = [7]
    keep = [True] * len(tree)
    mask = walk_grammar(grammar, tree, keep, 2)
    assert grammar.accepted == [7]  # rolled back to where it started
    kept = [tree.tokens[v] for v in range(1, len(tree)) if keep[v]]
    assert sorted(kept) == [1, 2, 4, 9]  # 5 and its subtree (2) are cut
    assert mask.shape == (len(tree), 2) and int(mask[0, 0]) & 1 == 0  # token 0 forbidden


def test_a_grammar_cuts_draft_trees_and_masks_every_node():
    # the segments hold multiples of 5, which the grammar forbids: branches through them are
    # cut, and the model's forbidden choices become the grammar's (masked) ones at every node
    a, b, c = list(range(10, 22)), list(range(22, 34)), list(range(34, 46))
    prompt = [7, 1, *a, 7, 1, *b, 7, 1, *c, 7]
    outs, grammars = [], []
    for spec in ({**SPEC, "speculative_break_even_tokens": 100}, {}):
        g = NoFivesGrammars()
        s, runner = make_scheduler(grammars=g, **spec)
        runner.predict = earliest_copy_model
        for i in range(4):
            submit(s, f"r{i}", [3] * i + prompt, max_new_tokens=30, regex="x")
        outs.append(run_to_end(s))
        grammars.append(s.draft_models)
    assert outs[0] == outs[1]
    assert grammars[1] is None  # the second run is the reference, without speculation
    assert all(t % 5 for ids, _ in outs[0].values() for t in ids)
    st = grammars[0].stats
    assert st.spec_branch_tokens > 0 and st.spec_accepted_tokens > 0


class FailingMaskGrammars(NoFivesGrammars):
    """NoFives grammars whose bitmask fill raises on its `fail_at`-th call, noting whether the
    failing step carried drafts."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.calls = fail_at, 0
        self.runner = None
        self.failed_beside_drafts = False

    def fill_mask(self, reqs):
        self.calls += 1
        if self.calls == self.fail_at:
            self.failed_beside_drafts = self.runner.batches[-1].draft_rows is not None
            raise RuntimeError("fill_mask")
        return super().fill_mask(reqs)


def test_a_sampling_failure_beside_drafted_rows_frees_their_draft_slots():
    # a greedy request drafting from its repeats beside a sampled constrained one (it drafts
    # nothing: greedy-only speculation) whose mask fill fails part-way: the step's requests
    # fail with a 500, and the drafted row's draft slots and branch rows are freed with the rest
    a, b, c = list(range(10, 22)), list(range(22, 34)), list(range(34, 46))
    prompt = [7, 1, *a, 7, 1, *b, 7, 1, *c, 7]
    spec = {**SPEC, "speculative_break_even_tokens": 100, "speculative_greedy_only": True}
    beside_drafts = 0
    for fail_at in range(2, 10):
        g = FailingMaskGrammars(fail_at)
        s, runner = make_scheduler(grammars=g, **spec)
        g.runner = runner
        runner.predict = earliest_copy_model
        submit(s, "drafted", prompt, max_new_tokens=30)
        submit(s, "sampled", [3, *prompt], max_new_tokens=30, regex="x", temperature=0.5, seed=1)
        out = run_to_end(s)
        assert out["sampled"][1].status_code == 500, fail_at
        beside_drafts += g.failed_beside_drafts
        assert not s.running and not s.waiting and s.cache.protected_size() == 0
        assert s.req_to_token_pool.available_size() == s.req_to_token_pool.size
        assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size
    assert beside_drafts > 0  # the case this test is about did occur


def test_stop_tokens_and_max_new_tokens_cut_inside_an_accepted_draft():
    prompt = prompts(1)[0]
    full = reference(prompt, 40, copy_model)
    stop = full[17]
    first = full.index(stop)
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    submit(s, "stop", prompt, max_new_tokens=40, stop_token_ids=[stop])
    submit(s, "len", prompt, max_new_tokens=13)
    out = run_to_end(s)
    assert out["stop"] == (full[: first + 1], FinishReason.stop(stop))
    assert out["len"] == (full[:13], FinishReason.length(13))


def test_streaming_sends_every_token_once_in_order():
    prompt = prompts(2)[1]
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    submit(s, "s", prompt, max_new_tokens=50, stream=True)
    chunks: list[list[int]] = []
    while s.has_work:
        for batch in s.step():
            chunks.extend(d.new_token_ids for d in batch.deltas)
    assert [t for c in chunks for t in c] == reference(prompt, 50, copy_model)
    assert max(len(c) for c in chunks) > 1  # several verified tokens per message


def test_abort_mid_speculation_frees_everything():
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    for i, p in enumerate(prompts(3)):
        submit(s, f"r{i}", p, max_new_tokens=200)
    for _ in range(6):
        s.step()
    s.abort(AbortReq("r1"))
    out = run_to_end(s)
    assert out["r1"][1].kind == "abort"
    assert out["r0"][0] == reference(prompts(3)[0], 200, copy_model)
    assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size


def test_a_short_pool_runs_drafts_only_where_they_fit():
    reqs = [(f"r{i}", p, 120) for i, p in enumerate(prompts(4))]
    out, _, _ = run(copy_model, reqs, pool_tokens=640, **SPEC)
    for rid, prompt, n in reqs:
        assert out[rid][0] == reference(prompt, n, copy_model)


@pytest.mark.parametrize("pool", [186, 193])
def test_drafts_take_only_what_the_steps_own_tokens_leave(pool):
    """Two requests that outgrow the pool (retractions): the step's own tokens are not
    allocated when drafts are planned, and drafts must not take their slots (they did: the
    step failed with 'planner admitted more tokens than the pool holds')."""
    n = pool // 2 + 5
    reqs = [(f"r{i}", p[:20], n) for i, p in enumerate(prompts(2))]
    out, s, _ = run(copy_model, reqs, pool_tokens=pool, **SPEC)
    for rid, prompt, n in reqs:
        assert out[rid] == (reference(prompt, n, copy_model), FinishReason.length(n))
    assert s.draft_models.stats.spec_accepted_tokens > 0


def test_penalised_and_greedy_only_sampled_requests_decode_without_drafts():
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    submit(s, "p", prompts(1)[0], max_new_tokens=20, frequency_penalty=0.5)
    run_to_end(s)
    assert s.draft_models.stats.spec_verified_requests == 0
    s, runner = make_scheduler(speculative_greedy_only=True, **SPEC)
    runner.predict = copy_model
    submit(s, "t", prompts(1)[0], max_new_tokens=20, temperature=0.5)
    run_to_end(s)
    assert s.draft_models.stats.spec_verified_requests == 0


def test_a_large_batch_switches_drafting_off():
    reqs = [(f"r{i}", p, 12) for i, p in enumerate(prompts(6))]
    out, s, _ = run(copy_model, reqs, speculative_max_verify_tokens=4, **SPEC)
    assert s.draft_models.stats.spec_skipped_steps > 0
    for rid, prompt, n in reqs:
        assert out[rid][0] == reference(prompt, n, copy_model)


def test_under_overlap_only_steps_without_drafting_requests_overlap():
    # greedy requests draft (their steps run one by one, the draft after the last token on the
    # host); sampled ones under --speculative-greedy-only never draft: once only they are left,
    # steps overlap. Outputs equal the reference either way.
    a, b, c = list(range(10, 22)), list(range(22, 34)), list(range(34, 46))
    prompt = [7, 1, *a, 7, 1, *b, 7, 1, *c, 7]
    spec = {**SPEC, "speculative_break_even_tokens": 100, "speculative_greedy_only": True}
    outs = {}
    for overlap in (False, True):
        s, runner = make_scheduler(enable_overlap_schedule=overlap, **spec)
        assert s.overlap is overlap
        runner.predict = earliest_copy_model
        submit(s, "greedy", prompt, max_new_tokens=12)
        for i in range(3):
            submit(s, f"sampled{i}", prompt, max_new_tokens=40, temperature=0.5, seed=i)
        in_flight = count_steps_in_flight(s)
        outs[overlap] = run_to_end(s)
        assert s.draft_models.stats.spec_accepted_tokens > 0  # the greedy request drafted
        if overlap:
            assert sum(in_flight) > 10  # the sampled requests' steps, once it was done
        assert not s.running and s.inflight is None
        assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size
    assert outs[True] == outs[False]
    assert outs[True]["greedy"][0] == reference(prompt, 12, earliest_copy_model)


def test_a_step_carrying_drafts_is_never_left_in_flight():
    # a greedy request preempted by a sampled (never drafting) one is re-admitted with output
    # in an overlapped step and drafts there: that step is committed at once, and the outputs and
    # the KV accounting (debug_invariants) are as without overlap
    a, b, c = list(range(10, 22)), list(range(22, 34)), list(range(34, 46))
    prompt = [7, 1, *a, 7, 1, *b, 7, 1, *c, 7]
    flags = {
        **SPEC,
        "speculative_break_even_tokens": 100,
        "speculative_greedy_only": True,
        "enable_priority_scheduling": True,
        "max_running_requests": 1,
    }
    outs = {}
    for overlap in (False, True):
        s, runner = make_scheduler(enable_overlap_schedule=overlap, **flags)
        runner.predict = earliest_copy_model
        submit(s, "greedy", prompt, max_new_tokens=60)
        for _ in range(2):
            s.step()
        sp = SamplingParams.from_dict({"max_new_tokens": 12, "temperature": 0.5})
        s.add_request(
            TokenizedGenerateReq(
                "sampled", [3, *prompt], sp, arrival_time=time.time(), priority=100
            )
        )
        drafted_in_flight: list[bool] = []
        real_step = s.step

        def step(real_step=real_step, s=s, seen=drafted_in_flight):
            out = real_step()
            seen.append(s.inflight is not None and s.inflight.plan.drafted)
            return out

        s.step = step
        outs[overlap] = run_to_end(s)
        assert s.stats.retractions == 1  # the greedy request was preempted
        assert not any(drafted_in_flight)
        assert s.draft_models.stats.spec_accepted_tokens > 0
        assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size
    assert outs[True] == outs[False]


def test_flags_are_checked():
    with pytest.raises(InvalidRequestError, match="NGRAM"):
        ServerArgs.from_kwargs(speculative_algorithm="EAGLE")
    with pytest.raises(InvalidRequestError, match="max_match"):
        ServerArgs.from_kwargs(
            speculative_algorithm="NGRAM",
            speculative_ngram_min_match_window_size=4,
            speculative_ngram_max_match_window_size=2,
        )
    with pytest.raises(InvalidRequestError, match="speculative_ngram_capacity must be >= 0"):
        ServerArgs.from_kwargs(speculative_algorithm="NGRAM", speculative_ngram_capacity=-1)


def test_drafts_that_do_not_pay_are_mostly_skipped():
    reqs = [(f"r{i}", p, 60) for i, p in enumerate(prompts(5))]
    drafted = {}

    def half_copy(ids: list[int]) -> int:  # drafts of a few tokens hit, longer ones miss
        return copy_model(ids) if len(ids) % 3 else next_token(ids)

    for even in (1, 10_000):  # a step is dear at once / almost free
        out, s, _ = run(half_copy, reqs, **{**SPEC, "speculative_break_even_tokens": even})
        assert all(out[rid][0] == reference(p, n, half_copy) for rid, p, n in reqs)
        drafted[even] = s.draft_models.stats.spec_draft_tokens
    # a dear step drafts only what its acceptance model says pays (here: nothing to learn from)
    assert drafted[1] < drafted[10_000] / 2 and drafted[10_000] > 0


def test_the_measured_step_cost_decides_how_much_is_drafted():
    """With the step-cost model learning (the default), a runner whose rows are dear (each row
    of a step costs 6x its fixed part) gets far fewer draft tokens than one whose rows are
    nearly free (a fixed part 100x a row's), for the same requests; outputs unchanged."""
    import time

    reqs = [(f"r{i}", p, 40) for i, p in enumerate(prompts(4))]

    def half_copy(ids: list[int]) -> int:
        return copy_model(ids) if len(ids) % 4 else next_token(ids)

    drafted = {}
    for name, base_s, row_s in (("free rows", 0.005, 0.00005), ("dear rows", 0.0005, 0.003)):
        s, runner = make_scheduler(speculative_algorithm="NGRAM")
        toy_forward = runner.forward

        def timed(batch, toy_forward=toy_forward, base_s=base_s, row_s=row_s):
            time.sleep(base_s + row_s * batch.num_tokens)
            return toy_forward(batch)

        runner.forward = timed
        runner.predict = half_copy
        for rid, prompt, n in reqs:
            submit(s, rid, prompt, max_new_tokens=n)
        out = run_to_end(s)
        assert all(out[rid][0] == reference(p, n, half_copy) for rid, p, n in reqs)
        drafted[name] = s.draft_models.stats.spec_draft_tokens
    assert drafted["dear rows"] < drafted["free rows"] / 3, drafted


def test_sampled_verification_keeps_the_samples_and_their_distribution():
    """Sampled requests (temperature 0.25 over the toy logits: the copy token has probability
    e^4 / (e^4 + 49) ~ 0.53, every other token the rest shared evenly) with drafts of the copy
    tokens: over 1,500 seeds the outputs equal those without speculation, seed for seed; the
    number of copy tokens among the 5 outputs is Binomial(5, p), each position alone
    Bernoulli(p), and the other tokens are uniform (chi-square tests at the 0.1% level; the
    seeds are fixed, so the test is deterministic)."""
    import math

    n_req, n_out, temp = 1500, 5, 0.25
    weight = math.exp(1 / temp)
    p = weight / (weight + VOCAB - 1)
    prompt = prompts(1)[0][:22]
    s, runner = make_scheduler(
        pool_tokens=16384,
        speculative_max_verify_tokens=1000,  # every request drafts in every step
        **{**SPEC, "speculative_break_even_tokens": 100_000},
    )
    runner.predict = copy_model
    for i in range(n_req):
        submit(s, f"r{i}", prompt, max_new_tokens=n_out, temperature=temp, seed=i, ignore_eos=True)
    out = run_to_end(s)
    st = s.draft_models.stats
    assert st.spec_accepted_tokens > 1000 and st.spec_draft_tokens > st.spec_accepted_tokens + 1000
    # each row draws with the request's own uniform for that position: the very same samples
    base, base_runner = make_scheduler(pool_tokens=16384)
    base_runner.predict = copy_model
    for i in range(n_req):
        submit(
            base, f"r{i}", prompt, max_new_tokens=n_out, temperature=temp, seed=i, ignore_eos=True
        )
    assert run_to_end(base) == out
    preds = reference(prompt, n_out, copy_model)  # the copy tokens come from the prompt alone
    hits = [sum(t == c for t, c in zip(out[f"r{i}"][0], preds, strict=True)) for i in range(n_req)]
    expected = [n_req * math.comb(n_out, h) * p**h * (1 - p) ** (n_out - h) for h in range(6)]
    observed = [hits.count(h) for h in range(6)]
    assert _chi2(observed, expected) < 20.5  # df 5
    for j in range(n_out):
        at_j = sum(out[f"r{i}"][0][j] == preds[j] for i in range(n_req))
        assert _chi2([at_j, n_req - at_j], [n_req * p, n_req * (1 - p)]) < 10.8  # df 1
    others = [0.0] * VOCAB
    seen = [0] * VOCAB
    for i in range(n_req):
        for t, c in zip(out[f"r{i}"][0], preds, strict=True):
            if t != c:
                seen[t] += 1
                for v in range(VOCAB):
                    others[v] += (v != c) / (VOCAB - 1)
    assert _chi2(seen, others) < 90.0  # df 49


def _chi2(observed: list[int], expected: list[float]) -> float:
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)


def test_a_seeded_sampled_request_is_the_same_alone_and_in_a_batch():
    prompt = prompts(3)[2]
    params = {"temperature": 0.3, "seed": 11, "ignore_eos": True}
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    submit(s, "alone", prompt, max_new_tokens=40, **params)
    alone = run_to_end(s)["alone"][0]
    s, runner = make_scheduler(**SPEC)
    runner.predict = copy_model
    for i, p in enumerate(prompts(4)):
        submit(s, f"o{i}", p, max_new_tokens=30 + i)
    submit(s, "batched", prompt, max_new_tokens=40, **params)
    assert run_to_end(s)["batched"][0] == alone
    assert s.draft_models.stats.spec_accepted_tokens > 0
