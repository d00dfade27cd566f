"""Speculative decoding in the scheduler: drafts at planning, verification after the forward
(scheduler process; a mixin of `Scheduler`).

Planning: every planned request whose step reaches the end of its sequence (decodes, and
extends of jump-forward text or resumed requests) may get an n-gram draft, appended to its
step's tokens; a constrained request's draft is walked by its grammar (cut at the first token it
rejects, one bitmask row per verified position). Drafts go to the requests with the best recent
acceptance first, within `speculative_max_verify_tokens` per step, and only to those whose
acceptance pays for the tokens they add to the step (`speculative_break_even_tokens`); a
step with `speculative_max_verify_tokens` decoding requests or more runs none (compute-bound). After the forward, each verified request appends
its accepted tokens one by one through the same path as a sampled token (finish checks, grammar,
jump-forward, which ends the step's tokens as it would end a decode), keeps the KV of the tokens
it kept and frees the rest (whole pages beyond its last one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.runtime.scheduler.containment import internal_error, log_internal_error
from radixgen.runtime.scheduler.schedule_batch import pages_needed
from radixgen.runtime.speculative.ngram import DraftState
from radixgen.runtime.speculative.verify import Verified, verify_drafts

if TYPE_CHECKING:
    from radixgen.runtime.constrained.grammar_manager import GrammarManager, JumpForwardEdit
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.model_executor.model_runner import LogitsOutput
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.scheduler.schedule_batch import StepBatch
    from radixgen.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass
class SpecStats:
    """Counters since start (in /server_info): verified request-steps, draft tokens proposed and
    accepted, steps that carried drafts, and steps where drafting was switched off by size."""

    spec_verify_steps: int = 0
    spec_verified_requests: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
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
    spec_stats: SpecStats

    def _init_speculation(self) -> None:
        self.spec_enabled = self.args.speculative.enabled
        self.spec_stats = SpecStats()

    # --- planning -----------------------------------------------------------------------------

    def _plan_drafts(self, plan: list[Req]) -> None:
        """Give drafts to the planned requests that may verify one (see the module docstring)."""
        for r in plan:
            r.draft, r.draft_mask = [], None
        cfg = self.args.speculative
        budget = cfg.speculative_max_verify_tokens
        ends = [r for r in plan if self._may_draft(r)]
        if not ends:
            return
        if sum(1 for r in plan if r.extend_len == 1) >= budget:
            self.spec_stats.spec_skipped_steps += 1
            return
        # best recent acceptance first: they make the most of the step's budget
        ends.sort(key=lambda r: -r.draft_state.accept_rate if r.draft_state else -0.5)
        free = self.kv_pool.available_size()
        # NOTE: a step computing T tokens costs ~ (W + T) token-times and yields one token per
        # sampling request; k more draft tokens pay when they yield more than k * out / (W + T),
        # i.e. when the request's accepted share beats `out / (W + T)` (both grow as drafts go in)
        fixed = cfg.speculative_break_even_tokens
        tokens_in = float(sum(r.extend_len for r in plan))
        tokens_out = float(sum(1 for r in plan if r.kv_len + r.extend_len == r.seq_len))
        for r in ends:
            if budget <= 0:
                break
            threshold = tokens_out / (fixed + tokens_in)
            state = r.draft_state
            if state is None:
                state = r.draft_state = DraftState(
                    cfg.speculative_ngram_min_match_window_size,
                    cfg.speculative_ngram_max_match_window_size,
                    cfg.speculative_num_draft_tokens,
                )
            longest = state.should_draft(threshold)
            if longest == 0:
                continue
            sp = r.sampling_params
            room = min(
                sp.max_new_tokens - len(r.output_ids) - 1,  # the bonus token is one more
                self.context_length - r.seq_len - 1,
            )
            k = min(longest, budget, room)
            if k <= 0:
                continue
            draft = self._propose(r, state, k)
            if not draft:
                continue
            need = pages_needed(r, r.extend_len + len(draft), self.page_size)
            need -= pages_needed(r, r.extend_len, self.page_size)
            if need * self.page_size > free:
                r.draft_mask = None
                continue
            free -= need * self.page_size
            budget -= len(draft)
            tokens_in += len(draft)
            tokens_out += state.accept_rate * len(draft)
            r.draft = draft
            r.extend_len += len(draft)

    def _propose(self, r: Req, state: DraftState, k: int) -> list[int]:
        """Request r's draft of up to k tokens (grammar-walked), or [] (also when drafting
        raises: a draft is optional, the request decodes on without one)."""
        try:
            draft = state.index.propose(r.all_ids, k)
            if draft and r.grammar is not None:
                draft = self._walk_grammar(r, draft)
            return draft
        except Exception as e:
            log_internal_error(f"drafting for request {r.rid}", e)
            r.draft_mask, r.draft_state = None, None
            return []

    def _may_draft(self, r: Req) -> bool:
        """Requests whose step ends at their sequence's end and whose next tokens depend on the
        logits alone (no penalties, biases or pending min_new_tokens); greedy ones, and sampled
        ones unless --speculative-greedy-only."""
        sp = r.sampling_params
        return (
            r.kv_len + r.extend_len == r.seq_len
            and bool(r.output_ids)
            and not r.pending_sample
            and (sp.is_greedy or not self.args.speculative.speculative_greedy_only)
            and not sp.logit_bias
            and not sp.frequency_penalty
            and not sp.presence_penalty
            and sp.repetition_penalty == 1.0
            and not (sp.min_new_tokens and len(r.output_ids) < sp.min_new_tokens)
        )

    def _walk_grammar(self, r: Req, draft: list[int]) -> list[int]:
        """The draft cut at the first token the grammar rejects; sets `r.draft_mask` to the
        grammar's bitmask at every verified position. The matcher ends where it started."""
        assert self.grammar_manager is not None and r.grammar is not None
        grammar = r.grammar
        mask = torch.full(
            (len(draft) + 1, self.grammar_manager.bitmask_words), -1, dtype=torch.int32
        )
        accepted = 0
        try:
            for i in range(len(draft) + 1):
                grammar.fill_next_token_bitmask(mask, i)
                if i == len(draft):
                    break
                tok = draft[i]
                allowed = (int(mask[i, tok >> 5]) >> (tok & 31)) & 1
                if not allowed or not grammar.accept_token(tok):
                    del draft[i:]
                    break
                accepted += 1
                if grammar.is_terminated():  # the request ends with this token
                    del draft[i + 1 :]
                    break
        finally:
            grammar.rollback(accepted)
        r.draft_mask = mask[: len(draft) + 1] if draft else None
        return draft

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
                self._keep_kv(r, 0)
                r.draft = []
            raise
        finally:
            for r, _ in items:
                r.draft_mask = None
        for (r, _), v in zip(items, results, strict=True):
            self._commit_verified(r, v)

    def _commit_verified(self, r: Req, v: Verified) -> None:
        """Append the verified tokens as sampled ones, then settle the request's KV."""
        drafted = len(r.draft)
        st = self.spec_stats
        st.spec_verified_requests += 1
        st.spec_draft_tokens += drafted
        st.spec_accepted_tokens += v.accepted_drafts
        if r.draft_state is not None:
            max_len = self.args.speculative.speculative_num_draft_tokens
            r.draft_state.record(drafted, v.accepted_drafts, max_len)
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
            self._keep_kv(r, appended)
            r.draft = []
        if edit is not None:
            self._apply_jump(r, edit)

    def _keep_kv(self, r: Req, appended: int) -> None:
        """Keep the KV of the step's real tokens and of the first `appended - 1` draft tokens
        (the last appended token has none yet); free the rest, keeping the last page whole."""
        end = r.kv_len
        start = end - r.extend_len
        drafted = len(r.draft)
        keep = end - drafted - 1 + appended if appended else end - drafted
        if r.req_pool_idx is not None:
            first_free = -(-keep // self.page_size) * self.page_size
            if end > first_free:
                row = self.req_to_token_pool.req_to_token[r.req_pool_idx]
                self.kv_pool.free(row[first_free:end].clone())
        r.kv_len = keep
        r.extend_len = keep - start

    if TYPE_CHECKING:  # provided by Scheduler

        def _append_token(
            self, r: Req, tok: int, lp: float | None, top: list[tuple[float, int]] | None
        ) -> None: ...

        def _find_jump(self, r: Req) -> JumpForwardEdit | None: ...

        def _apply_jump(self, r: Req, edit: JumpForwardEdit) -> None: ...
