"""Speculative decoding's planning half: draft trees for the planned rows (scheduler process).

Every planned request whose step reaches the end of its sequence (decodes, and extends of
jump-forward text or resumed requests) may get a draft tree: the continuations of earlier
occurrences of its suffix merged into a trie (runtime/speculative/draft_tree.py), each node with
the probability that verification accepts it (runtime/speculative/policy.py). Nodes are offered
to the whole step, best probability per millisecond first, and taken while they raise the step's
expected tokens per millisecond (the step-cost model is fitted to measured step times), within
`speculative_max_verify_tokens`; a step with that many decoding requests or more runs none
(compute-bound). A constrained request's tree is walked by its grammar (cut at the tokens it
rejects, one bitmask row per node). The tree's main chain runs as the request's own extend,
every other chain in a spare request row (pages of one token only; with larger pages a draft is
one chain). `draft_verifier.py` is the other half.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixgen.internal_state import SpeculationState
from radixgen.runtime.scheduler.containment import log_internal_error
from radixgen.runtime.scheduler.schedule_batch import pages_needed
from radixgen.runtime.speculative.draft_tree import (
    CandidateTree,
    StepDraft,
    step_draft,
    walk_grammar,
)
from radixgen.runtime.speculative.ngram import SharedCorpus
from radixgen.runtime.speculative.policy import (
    COST_MAX_EXTEND,
    COST_MAX_ROWS,
    AcceptanceModel,
    DraftState,
    NodeOffer,
    StepCostModel,
    select_drafts,
)

if TYPE_CHECKING:
    from radixgen.runtime.constrained.grammar_manager import GrammarManager
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.scheduler.step_plan import StepPlan
    from radixgen.speculative_config import SpeculativeConfig

logger = logging.getLogger(__name__)

# the step-cost model's prior (milliseconds; a 2-core CPU and the default model), used until
# steps are measured: the fixed part of a step, one more row, and one more row's attention
# over 1,024 keys
PRIOR_BASE_MS, PRIOR_ROW_MS, PRIOR_KEYS_MS = 4.5, 0.35, 0.25


@dataclass
class DraftModels:
    """What speculation learns as it runs, shared by the draft planner (which reads it) and the
    verifier (which teaches it): acceptance, step cost, the corpus of finished outputs."""

    stats: SpeculationState
    accept: AcceptanceModel
    corpus: SharedCorpus
    cost: StepCostModel  # steps without drafts
    cost_drafted: StepCostModel  # steps carrying drafts (itself without CUDA graphs)

    @classmethod
    def create(cls, cfg: SpeculativeConfig, graphs: bool) -> DraftModels:
        """`graphs`: plain decode steps replay a CUDA graph, so drafted steps (eager) are
        learnt apart."""
        corpus = SharedCorpus(
            cfg.speculative_ngram_capacity,
            cfg.speculative_ngram_min_match_window_size,
            cfg.speculative_ngram_max_match_window_size,
        )
        fixed = cfg.speculative_break_even_tokens
        if fixed:  # a fixed rule: a step costs (fixed + rows) token-times, rows alike
            cost = StepCostModel(float(fixed), 1.0, 0.0, learn=False)
            return cls(SpeculationState(), AcceptanceModel(), corpus, cost, cost)
        cost = StepCostModel(PRIOR_BASE_MS, PRIOR_ROW_MS, PRIOR_KEYS_MS, learn=True)
        drafted = cost
        if graphs:
            # NOTE: a step with drafts runs eagerly (7x dearer on the H200 at batch 8). Without
            # graphs both kinds of step fit one line, and one model learns it from every step.
            drafted = StepCostModel(PRIOR_BASE_MS, PRIOR_ROW_MS, PRIOR_KEYS_MS, learn=True)
        return cls(SpeculationState(), AcceptanceModel(), corpus, cost, drafted)

    def observe_step(self, batch: ForwardBatch, seconds: float) -> None:
        """Teach the step-cost model one step's measured time (decode-like steps only), from the
        rows that ran: the draft branches' pseudo-requests included."""
        lens = batch.extend_lens
        rows = sum(lens)
        if rows > COST_MAX_ROWS or max(lens, default=0) > COST_MAX_EXTEND:
            return  # a prefill: its rows cost what a decode row does not
        attended = sum(e * (p + (e + 1) / 2) for p, e in zip(batch.prefix_lens, lens, strict=True))
        model = self.cost if batch.draft_rows is None else self.cost_drafted
        model.observe(rows, attended, seconds * 1e3)


@dataclass
class DraftPlanner:
    """Draft trees for a step's planned rows, within what the KV pool and spare rows hold."""

    cfg: SpeculativeConfig
    models: DraftModels
    kv_pool: TokenToKVPool
    req_to_token_pool: ReqToTokenPool
    context_length: int
    page_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.page_size = self.kv_pool.page_size

    def plan(
        self, rows: list[tuple[Req, int]], grammars: GrammarManager | None
    ) -> list[StepDraft | None]:
        """Each planned (request, tokens) row's draft, or None (see the module docstring)."""
        drafts: list[StepDraft | None] = [None] * len(rows)
        cfg, models = self.cfg, self.models
        budget = cfg.speculative_max_verify_tokens
        ends = [i for i, (r, n) in enumerate(rows) if self._may_draft(r, n)]
        if not ends:
            return drafts
        if sum(1 for _, n in rows if n == 1) >= budget:
            models.stats.spec_skipped_steps += 1
            return drafts
        breadth = cfg.speculative_ngram_max_bfs_breadth if self.page_size == 1 else 1
        n_rows = sum(n for _, n in rows)
        attended = sum(n * (r.kv_len + (n + 1) / 2) for r, n in rows)
        tokens = float(sum(1 for r, n in rows if r.kv_len + n == r.seq_len))
        plain_ms = models.cost.predict_ms(n_rows, attended)
        step_ms = max(plain_ms, models.cost_drafted.predict_ms(n_rows, attended))
        rate = tokens / step_ms  # what a node must beat per millisecond (it only rises)
        trees: list[tuple[int, CandidateTree]] = []
        offers: list[NodeOffer] = []
        for i in ends:
            r = rows[i][0]
            sp = r.sampling_params
            depth = min(
                cfg.speculative_num_draft_tokens,
                sp.max_new_tokens - len(r.output_ids) - 1,  # the bonus token is one more
                self.context_length - r.seq_len - 1,
            )
            cost = models.cost_drafted.row_ms(r.seq_len)
            tree = self._candidate_tree(r, breadth, depth, rate * cost) if depth > 0 else None
            if tree is None:
                continue
            owner = len(trees)
            trees.append((i, tree))
            for v in range(1, len(tree)):
                p = tree.prob[v]
                offers.append(NodeOffer(-p / cost, p, cost, owner, v, tree.parents[v]))
        if not offers:
            return drafts
        taken = select_drafts(offers, tokens, plain_ms, step_ms, budget)
        keeps: dict[int, list[bool]] = {}
        for o in taken:
            if o.owner not in keeps:
                keeps[o.owner] = [True] + [False] * (len(trees[o.owner][1]) - 1)
            keeps[o.owner][o.node] = True
        # NOTE: the step's own tokens are not allocated yet: the drafts get what they leave
        free = self.kv_pool.available_size() - self.page_size * sum(
            pages_needed(r, n, self.page_size) for r, n in rows
        )
        spare_rows = self.req_to_token_pool.available_size()
        for owner, keep in keeps.items():
            i, tree = trees[owner]
            r, n = rows[i]
            draft = self._step_draft(r, tree, keep, grammars)
            while draft is not None and (len(draft.chains) - 1 > spare_rows or len(draft) > free):
                draft = _without_last_chain(draft)
            if draft is None or not draft.chains:  # nothing left (the grammar cut it all)
                continue
            need = pages_needed(r, n + len(draft.chains[0]), self.page_size)
            need -= pages_needed(r, n, self.page_size)
            need = need * self.page_size + draft.branch_tokens
            if need > free:
                continue
            free -= need
            spare_rows -= len(draft.chains) - 1
            drafts[i] = draft
        return drafts

    def _candidate_tree(
        self, r: Req, breadth: int, depth: int, least: float
    ) -> CandidateTree | None:
        """Request r's candidate tree; None when nothing is found, when even its best first
        token's probability could not beat `least` (no node of it would pay: the tree is not
        built), or when drafting raised (a draft is optional: the request decodes on)."""
        state = r.draft_state
        if state is None:
            cfg = self.cfg
            state = r.draft_state = DraftState(
                cfg.speculative_ngram_min_match_window_size,
                cfg.speculative_ngram_max_match_window_size,
            )
        try:
            tokens = r.all_ids
            found = state.index.candidates(tokens, breadth)
            corpus = self.models.corpus
            if len(found) < breadth and corpus.capacity:
                found += corpus.candidates(tokens, breadth - len(found), depth)
            model, mine = self.models.accept, state.acceptance
            if max((model.prob(1, c.match, 1.0, mine) for c in found), default=0.0) <= least:
                return None  # also when nothing is found
            return CandidateTree.build(tokens, found, depth, model, mine)
        except Exception as e:
            log_internal_error(f"drafting for request {r.rid}", e)
            r.draft_state = None
            return None

    def _step_draft(
        self, r: Req, tree: CandidateTree, keep: list[bool], grammars: GrammarManager | None
    ) -> StepDraft | None:
        """The selected nodes as chains, cut by the request's grammar (with its mask rows)."""
        mask = None
        try:
            if r.grammar is not None:
                assert grammars is not None
                mask = walk_grammar(r.grammar, tree, keep, grammars.bitmask_words)
            return step_draft(tree, keep, mask)
        except Exception as e:
            log_internal_error(f"walking the draft of request {r.rid}", e)
            r.draft_state = None
            return None

    def remember_output(self, r: Req) -> None:
        """A finished request's output (after its prompt's last few tokens) joins the shared
        corpus later requests draft from (a failure here costs drafts, never the release)."""
        corpus = self.models.corpus
        if not (corpus.capacity and r.output_ids):
            return
        tail = self.cfg.speculative_ngram_max_match_window_size
        try:
            corpus.add(r.origin_input_ids[-tail:] + r.output_ids)
        except Exception as e:
            log_internal_error(f"keeping the output of request {r.rid} to draft from", e)
            corpus.clear()

    def _may_draft(self, r: Req, n: int) -> bool:
        """Requests whose step (n tokens) ends at their sequence's end, with output to draft
        from, whose kind drafts (`drafting_kind`)."""
        return (
            r.kv_len + n == r.seq_len
            and bool(r.output_ids)
            and not r.pending_sample
            and self.drafting_kind(r)
        )

    def drafting_kind(self, r: Req) -> bool:
        """Requests whose next tokens depend on the logits alone (no penalties, biases or
        pending min_new_tokens, no checked values); greedy ones, and sampled ones unless
        --speculative-greedy-only."""
        sp = r.sampling_params
        return (
            r.value_checker is None  # its rollbacks and bans work one token at a time
            and (sp.is_greedy or not self.cfg.speculative_greedy_only)
            and not sp.logit_bias
            and not sp.frequency_penalty
            and not sp.presence_penalty
            and sp.repetition_penalty == 1.0
            and not (sp.min_new_tokens and len(r.output_ids) < sp.min_new_tokens)
        )


def allocate_branches(
    plan: StepPlan, kv_pool: TokenToKVPool, req_to_token_pool: ReqToTokenPool
) -> tuple[torch.Tensor | None, list[int]]:
    """KV slots and spare request rows of the planned trees' branches, recorded in their
    drafts: the slots in batch order (None when no tree has branches) and the rows, which the
    step gives back when it is committed. Planning reserved both."""
    trees = [d for d in plan.drafts or () if d is not None and len(d.chains) > 1]
    if not trees:
        return None, []
    slots = kv_pool.alloc(sum(t.branch_tokens for t in trees))
    assert slots is not None, "planning reserved the branches' slots"
    rows: list[int] = []
    try:
        at = 0
        for t in trees:
            t.slots = [-1] * (len(t) + 1)
            t.branch_rows = []
            for chain in t.chains[1:]:
                row = req_to_token_pool.alloc()
                assert row is not None, "planning reserved the branches' rows"
                t.branch_rows.append(row)
                rows.append(row)
                for v in chain:
                    t.slots[v] = int(slots[at])
                    at += 1
    except Exception:
        kv_pool.free(slots)
        for row in rows:
            req_to_token_pool.free(row)
        raise
    return slots, rows


def _without_last_chain(draft: StepDraft) -> StepDraft:
    """The draft without its last chain (chains are in parent-first order, so what remains is a
    tree; node ids are in chain order, so its nodes are a prefix)."""
    chains = draft.chains[:-1]
    n = 1 + sum(len(c) for c in chains)
    return StepDraft(
        draft.tokens[:n], draft.parents[:n], draft.depths[:n], draft.match[:n], draft.share[:n],
        chains, None if draft.mask is None else draft.mask[:n],
    )  # fmt: skip
