"""Speculative decoding in the scheduler: draft trees at planning, verification after the forward
(scheduler process; a mixin of `Scheduler`).

Planning: every planned request whose step reaches the end of its sequence (decodes, and
extends of jump-forward text or resumed requests) may get a draft tree: the continuations of
earlier occurrences of its suffix merged into a trie (runtime/speculative/draft_tree.py), each
node with the probability that verification accepts it (runtime/speculative/policy.py). Nodes
are offered to the whole step, best probability per millisecond first, and taken while they
raise the step's expected tokens per millisecond (the step-cost model is fitted to measured
step times), within `speculative_max_verify_tokens`; a step with that many decoding requests
or more runs none (compute-bound). A constrained request's tree is walked by its grammar (cut
at the tokens it rejects, one bitmask row per node). The tree's main chain runs as the request's
own extend, every other chain in a spare request row (pages of one token only; with larger
pages a draft is one chain). After the forward, verification follows the tree from the root
along the model's choices; each verified request appends its accepted tokens one by one
through the same path as a sampled token (finish checks, grammar, jump-forward, which ends the
step's tokens as it would end a decode), keeps the KV of the path it kept and frees the rest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.runtime.scheduler.containment import internal_error, log_internal_error
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
from radixgen.runtime.speculative.verify import Verified, verify_drafts

if TYPE_CHECKING:
    from radixgen.runtime.constrained.grammar_manager import GrammarManager, JumpForwardEdit
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.runtime.model_executor.logits_output import LogitsOutput
    from radixgen.runtime.scheduler.interfaces import StepRunner
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.scheduler.schedule_batch import StepBatch
    from radixgen.server_args import ServerArgs

logger = logging.getLogger(__name__)

# the step-cost model's prior (milliseconds; a 2-core CPU and the default model), used until
# steps are measured: the fixed part of a step, one more row, and one more row's attention
# over 1,024 keys
PRIOR_BASE_MS, PRIOR_ROW_MS, PRIOR_KEYS_MS = 4.5, 0.35, 0.25


@dataclass
class SpecStats:
    """Counters since start (in /server_info): verified request-steps, draft tokens proposed and
    accepted (accepted ones on a branch other than the tree's main chain counted apart too),
    steps that carried drafts, and steps where drafting was switched off by size."""

    spec_verify_steps: int = 0
    spec_verified_requests: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_branch_tokens: int = 0
    spec_branch_accepted_tokens: int = 0
    spec_skipped_steps: int = 0

    def summary(self) -> dict[str, float]:
        n = self.spec_verified_requests
        return {
            # tokens appended per verified request-step (accepted drafts + the bonus token)
            "spec_accept_length": (self.spec_accepted_tokens + n) / n if n else 0.0,
            "spec_accept_rate": (
                self.spec_accepted_tokens / self.spec_draft_tokens
                if self.spec_draft_tokens
                else 0.0
            ),
        }


class SpeculativeScheduling:
    """Attributes below are set by `Scheduler.__init__` (`_init_speculation`)."""

    args: ServerArgs
    kv_pool: TokenToKVPool
    req_to_token_pool: ReqToTokenPool
    grammar_manager: GrammarManager | None
    page_size: int
    context_length: int
    vocab_size: int
    spec_enabled: bool
    model_runner: StepRunner
    spec_stats: SpecStats
    spec_accept: AcceptanceModel
    spec_cost: StepCostModel  # steps without drafts
    spec_cost_drafted: StepCostModel  # steps carrying drafts (itself without CUDA graphs)
    spec_branch_rows: list[int]
    spec_corpus: SharedCorpus

    def _init_speculation(self) -> None:
        cfg = self.args.speculative
        self.spec_enabled = cfg.enabled
        self.spec_stats = SpecStats()
        self.spec_accept = AcceptanceModel()
        self.spec_branch_rows = []
        self.spec_corpus = SharedCorpus(
            cfg.speculative_ngram_capacity,
            cfg.speculative_ngram_min_match_window_size,
            cfg.speculative_ngram_max_match_window_size,
        )
        fixed = cfg.speculative_break_even_tokens
        if fixed:  # a fixed rule: a step costs (fixed + rows) token-times, rows alike
            self.spec_cost = StepCostModel(float(fixed), 1.0, 0.0, learn=False)
            self.spec_cost_drafted = self.spec_cost
        else:
            self.spec_cost = StepCostModel(PRIOR_BASE_MS, PRIOR_ROW_MS, PRIOR_KEYS_MS, learn=True)
            self.spec_cost_drafted = self.spec_cost
            if getattr(self.model_runner, "graph_runner", None) is not None:
                # NOTE: learnt apart where plain decode steps replay a CUDA graph: a step with
                # drafts runs eagerly (7x dearer on the H200 at batch 8). Without graphs both
                # kinds of step fit one line, and one model learns it from every step.
                self.spec_cost_drafted = StepCostModel(
                    PRIOR_BASE_MS, PRIOR_ROW_MS, PRIOR_KEYS_MS, learn=True
                )

    # --- planning -----------------------------------------------------------------------------

    def _plan_drafts(self, plan: list[Req]) -> None:
        """Give draft trees to the planned requests that may verify one (see the module
        docstring)."""
        for r in plan:
            r.draft, r.draft_mask, r.draft_tree = [], None, None
        cfg = self.args.speculative
        budget = cfg.speculative_max_verify_tokens
        ends = [r for r in plan if self._may_draft(r)]
        if not ends:
            return
        if sum(1 for r in plan if r.extend_len == 1) >= budget:
            self.spec_stats.spec_skipped_steps += 1
            return
        breadth = cfg.speculative_ngram_max_bfs_breadth if self.page_size == 1 else 1
        rows = sum(r.extend_len for r in plan)
        attended = sum(r.extend_len * (r.kv_len + (r.extend_len + 1) / 2) for r in plan)
        tokens = float(sum(1 for r in plan if r.kv_len + r.extend_len == r.seq_len))
        plain_ms = self.spec_cost.predict_ms(rows, attended)
        step_ms = max(plain_ms, self.spec_cost_drafted.predict_ms(rows, attended))
        rate = tokens / step_ms  # what a node must beat per millisecond (it only rises)
        trees: list[tuple[Req, CandidateTree]] = []
        offers: list[NodeOffer] = []
        for r in ends:
            sp = r.sampling_params
            depth = min(
                cfg.speculative_num_draft_tokens,
                sp.max_new_tokens - len(r.output_ids) - 1,  # the bonus token is one more
                self.context_length - r.seq_len - 1,
            )
            cost = self.spec_cost_drafted.row_ms(r.seq_len)
            tree = self._candidate_tree(r, breadth, depth, rate * cost) if depth > 0 else None
            if tree is None:
                continue
            owner = len(trees)
            trees.append((r, tree))
            for v in range(1, len(tree)):
                p = tree.prob[v]
                offers.append(NodeOffer(-p / cost, p, cost, owner, v, tree.parents[v]))
        if not offers:
            return
        taken = select_drafts(offers, tokens, plain_ms, step_ms, budget)
        keeps: dict[int, list[bool]] = {}
        for o in taken:
            if o.owner not in keeps:
                keeps[o.owner] = [True] + [False] * (len(trees[o.owner][1]) - 1)
            keeps[o.owner][o.node] = True
        # NOTE: the step's own tokens are not allocated yet: the drafts get what they leave
        free = self.kv_pool.available_size() - self.page_size * sum(
            pages_needed(r, r.extend_len, self.page_size) for r in plan
        )
        spare_rows = self.req_to_token_pool.available_size()
        for owner, keep in keeps.items():
            r, tree = trees[owner]
            draft = self._step_draft(r, tree, keep)
            while draft is not None and (len(draft.chains) - 1 > spare_rows or len(draft) > free):
                draft = _without_last_chain(draft)
            if draft is None or not draft.chains:  # nothing left (the grammar cut it all)
                continue
            need = pages_needed(r, r.extend_len + len(draft.chains[0]), self.page_size)
            need -= pages_needed(r, r.extend_len, self.page_size)
            need = need * self.page_size + draft.branch_tokens
            if need > free:
                continue
            free -= need
            spare_rows -= len(draft.chains) - 1
            r.draft_tree, r.draft, r.draft_mask = draft, draft.main, draft.mask
            r.extend_len += len(r.draft)

    def _candidate_tree(
        self, r: Req, breadth: int, depth: int, least: float
    ) -> CandidateTree | None:
        """Request r's candidate tree; None when nothing is found, when even its best first
        token's probability could not beat `least` (no node of it would pay: the tree is not
        built), or when drafting raised (a draft is optional: the request decodes on)."""
        state = r.draft_state
        if state is None:
            cfg = self.args.speculative
            state = r.draft_state = DraftState(
                cfg.speculative_ngram_min_match_window_size,
                cfg.speculative_ngram_max_match_window_size,
            )
        try:
            tokens = r.all_ids
            found = state.index.candidates(tokens, breadth)
            if len(found) < breadth and self.spec_corpus.capacity:
                found += self.spec_corpus.candidates(tokens, breadth - len(found), depth)
            model, mine = self.spec_accept, state.acceptance
            if max((model.prob(1, c.match, 1.0, mine) for c in found), default=0.0) <= least:
                return None  # also when nothing is found
            return CandidateTree.build(tokens, found, depth, model, mine)
        except Exception as e:
            log_internal_error(f"drafting for request {r.rid}", e)
            r.draft_state = None
            return None

    def _step_draft(self, r: Req, tree: CandidateTree, keep: list[bool]) -> StepDraft | None:
        """The selected nodes as chains, cut by the request's grammar (with its mask rows)."""
        mask = None
        try:
            if r.grammar is not None:
                assert self.grammar_manager is not None
                mask = walk_grammar(r.grammar, tree, keep, self.grammar_manager.bitmask_words)
            return step_draft(tree, keep, mask)
        except Exception as e:
            log_internal_error(f"walking the draft of request {r.rid}", e)
            r.draft_state = None
            return None

    def _remember_output(self, r: Req) -> None:
        """A finished request's output (after its prompt's last few tokens) joins the shared
        corpus later requests draft from (a failure here costs drafts, never the release)."""
        if not (self.spec_enabled and self.spec_corpus.capacity and r.output_ids):
            return
        tail = self.args.speculative.speculative_ngram_max_match_window_size
        try:
            self.spec_corpus.add(r.origin_input_ids[-tail:] + r.output_ids)
        except Exception as e:
            log_internal_error(f"keeping the output of request {r.rid} to draft from", e)
            self.spec_corpus.clear()

    def _may_draft(self, r: Req) -> bool:
        """Requests whose step ends at their sequence's end and whose next tokens depend on the
        logits alone (no penalties, biases or pending min_new_tokens); greedy ones, and sampled
        ones unless --speculative-greedy-only."""
        sp = r.sampling_params
        return (
            r.kv_len + r.extend_len == r.seq_len
            and bool(r.output_ids)
            and not r.pending_sample
            and r.value_checker is None  # its rollbacks and bans work one token at a time
            and (sp.is_greedy or not self.args.speculative.speculative_greedy_only)
            and not sp.logit_bias
            and not sp.frequency_penalty
            and not sp.presence_penalty
            and sp.repetition_penalty == 1.0
            and not (sp.min_new_tokens and len(r.output_ids) < sp.min_new_tokens)
        )

    # --- running ------------------------------------------------------------------------------

    def _allocate_branches(self, plan: list[Req]) -> torch.Tensor | None:
        """KV slots and spare request rows of the planned trees' branches, recorded in their
        drafts (and the rows in `spec_branch_rows` until the step ends); the slots in batch
        order, or None when no tree has branches. Planning reserved both."""
        trees = [
            r.draft_tree for r in plan if r.draft_tree is not None and len(r.draft_tree.chains) > 1
        ]
        self.spec_branch_rows = []
        if not trees:
            return None
        slots = self.kv_pool.alloc(sum(t.branch_tokens for t in trees))
        assert slots is not None, "planning reserved the branches' slots"
        at = 0
        for t in trees:
            t.slots = [-1] * (len(t) + 1)
            t.branch_rows = []
            for chain in t.chains[1:]:
                row = self.req_to_token_pool.alloc()
                assert row is not None, "planning reserved the branches' rows"
                t.branch_rows.append(row)
                self.spec_branch_rows.append(row)
                for v in chain:
                    t.slots[v] = int(slots[at])
                    at += 1
        return slots

    def _release_branches(self, failed_slots: torch.Tensor | None) -> None:
        """Give back the step's branch rows (and, when the step failed before verification,
        the branches' KV slots)."""
        for row in self.spec_branch_rows:
            self.req_to_token_pool.free(row)
        self.spec_branch_rows = []
        if failed_slots is not None:
            self.kv_pool.free(failed_slots)

    def _observe_step_cost(self, batch: ForwardBatch, seconds: float) -> None:
        """Teach the step-cost model one step's measured time (decode-like steps only)."""
        lens = batch.extend_lens
        rows = sum(lens)
        if rows > COST_MAX_ROWS or max(lens, default=0) > COST_MAX_EXTEND:
            return  # a prefill: its rows cost what a decode row does not
        attended = sum(e * (p + (e + 1) / 2) for p, e in zip(batch.prefix_lens, lens, strict=True))
        model = self.spec_cost if batch.draft_rows is None else self.spec_cost_drafted
        model.observe(rows, attended, seconds * 1e3)

    # --- after the forward --------------------------------------------------------------------

    def _verify_drafts(self, batch: StepBatch, logits: LogitsOutput) -> None:
        """Verify the step's drafts and append each request's accepted tokens."""
        items = batch.verify_reqs
        if not items:
            return
        self.spec_stats.spec_verify_steps += 1
        try:
            results = verify_drafts(logits, items)
        except Exception:  # NOTE: the caller fails the batch: its KV must match its tokens
            for r, _ in items:
                self._keep_kv(r, [])
                r.draft, r.draft_tree = [], None
            raise
        finally:
            for r, _ in items:
                r.draft_mask = None
        for (r, _), v in zip(items, results, strict=True):
            self._commit_verified(r, v)

    def _commit_verified(self, r: Req, v: Verified) -> None:
        """Append the verified tokens as sampled ones, then settle the request's KV."""
        tree = r.draft_tree
        assert tree is not None
        st = self.spec_stats
        st.spec_verified_requests += 1
        st.spec_draft_tokens += len(tree)
        st.spec_accepted_tokens += len(v.path)
        st.spec_branch_tokens += tree.branch_tokens
        main = set(tree.chains[0]) if tree.chains else set()
        st.spec_branch_accepted_tokens += sum(1 for u in v.path if u not in main)
        if r.draft_state is not None:
            self._learn(r, tree, v.path)
        appended = 0
        edit = None
        try:
            for i, tok in enumerate(v.tokens):
                lp = v.logprobs[i] if v.logprobs is not None else None
                top = v.top_logprobs[i] if v.top_logprobs is not None else None
                appended += 1
                self._append_token(r, tok, lp, top)
                if r.finished:
                    break
                if r.grammar is not None:
                    edit = self._find_jump(r)
                    if edit is not None:
                        break  # a decode step would end here too: its forced text is next
        except Exception as e:  # NOTE: fail this request only (released by the caller)
            log_internal_error(f"accepting the verified tokens of request {r.rid}", e)
            r.finish(internal_error(e))
            edit = None
        finally:
            self._keep_kv(r, v.path[: max(appended - 1, 0)])
            r.draft, r.draft_tree = [], None
        if edit is not None:
            self._apply_jump(r, edit)

    def _learn(self, r: Req, tree: StepDraft, path: list[int]) -> None:
        """Every node whose parent was accepted was tested: teach the acceptance model."""
        assert r.draft_state is not None
        accepted = set(path)
        reached = {0, *path}
        mine = r.draft_state.acceptance
        for v in range(1, len(tree.tokens)):
            if tree.parents[v] in reached:
                self.spec_accept.observe(
                    tree.depths[v], tree.match[v], tree.share[v], v in accepted, mine
                )

    def _keep_kv(self, r: Req, kept: list[int]) -> None:
        """Keep the KV of the step's real tokens and of the draft nodes `kept` (the accepted
        path's nodes whose tokens were appended, the last appended token excepted: it was not
        an input of this step), in path order in the request's row; free every other draft slot
        (without branches, by position: with pages larger than one token, the last page stays
        whole)."""
        tree = r.draft_tree
        end = r.kv_len
        start = end - r.extend_len
        root_end = end - len(r.draft)  # the KV end with the step's real tokens
        keep = root_end + len(kept)
        if r.req_pool_idx is not None:
            if tree is not None and tree.branch_tokens:
                if kept:
                    slots = torch.tensor([tree.slots[v] for v in kept], dtype=torch.long)
                    self.req_to_token_pool.write_row(r.req_pool_idx, root_end, slots)
                mine = set(kept)
                unused = [tree.slots[v] for v in range(1, len(tree) + 1) if v not in mine]
                if unused:
                    self.kv_pool.free(torch.tensor(unused, dtype=torch.long))
            else:
                row = self.req_to_token_pool.req_to_token[r.req_pool_idx]
                first_free = -(-keep // self.page_size) * self.page_size
                if end > first_free:
                    self.kv_pool.free(row[first_free:end].clone())
        r.kv_len = keep
        r.extend_len = keep - start

    if TYPE_CHECKING:  # provided by Scheduler

        def _append_token(
            self, r: Req, tok: int, lp: float | None, top: list[tuple[float, int]] | None
        ) -> None: ...

        def _find_jump(self, r: Req) -> JumpForwardEdit | None: ...

        def _apply_jump(self, r: Req, edit: JumpForwardEdit) -> None: ...


def _without_last_chain(draft: StepDraft) -> StepDraft:
    """The draft without its last chain (chains are in parent-first order, so what remains is a
    tree; node ids are in chain order, so its nodes are a prefix)."""
    chains = draft.chains[:-1]
    n = 1 + sum(len(c) for c in chains)
    return StepDraft(
        draft.tokens[:n], draft.parents[:n], draft.depths[:n], draft.match[:n], draft.share[:n],
        chains, None if draft.mask is None else draft.mask[:n],
    )  # fmt: skip
