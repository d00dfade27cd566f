"""Commit a launched step's results: its requests' new tokens (sampled, or verified drafts),
their grammars, jump-forward and value checks, finish checks, and then each request's KV fate
(released to the cache, its prompt chunk cached, or kept) and its place in the outbox
(scheduler process).

The one place a step's results are committed, whichever mode launched it: a synchronous step is
committed right after its launch, an overlapped one after the next step's launch. A request that
finished (or was aborted) between the launch and the commit is left as it is; its token is
dropped. (A step carrying drafts is always committed at once, so no released request has a
draft to verify.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from radixgen.finish_reason import FinishReason
from radixgen.runtime.scheduler.containment import internal_error, log_internal_error
from radixgen.runtime.scheduler.finish import check_finish

if TYPE_CHECKING:
    from radixgen.internal_state import SchedulerCounters
    from radixgen.runtime.constrained.grammar_manager import GrammarManager, JumpForwardEdit
    from radixgen.runtime.mem_cache.base_prefix_cache import BasePrefixCache
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.sampling.sampler import SampleOutput
    from radixgen.runtime.scheduler.draft_verifier import DraftVerifier
    from radixgen.runtime.scheduler.interfaces import TextDecoder
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.scheduler.step_executor import LaunchedStep, StepExecutor
    from radixgen.runtime.scheduler.step_plan import StepRow
    from radixgen.runtime.speculative.verify import Verified

logger = logging.getLogger(__name__)


class RequestLifecycle(Protocol):
    """What the scheduler does for a request the processor is done with."""

    def release(self, req: Req) -> None:
        """A finished request: its KV to the cache, out of the running set."""

    def fail(self, reqs: Sequence[Req], e: Exception) -> None:
        """Finish `reqs` with a 500 abort and free what they hold."""

    def emit(self, reqs: list[Req]) -> None:
        """These requests have something to send (or may have: the outbox decides)."""


@dataclass(frozen=True)
class TokenLimits:
    """Where a request's tokens end."""

    context_length: int
    eos_token_ids: tuple[int, ...]


class ResultProcessor:
    def __init__(
        self,
        executor: StepExecutor,
        cache: BasePrefixCache,
        grammars: GrammarManager | None,
        verifier: DraftVerifier | None,
        tokenizer: TextDecoder,
        limits: TokenLimits,
        stats: SchedulerCounters,
        lifecycle: RequestLifecycle,
    ) -> None:
        self.executor = executor
        self.kv_pool: TokenToKVPool = executor.kv_pool
        self.req_to_token_pool: ReqToTokenPool = executor.req_to_token_pool
        self.cache = cache
        self.grammars = grammars
        self.verifier = verifier
        self.tokenizer = tokenizer
        self.limits = limits
        self.stats = stats
        self.lifecycle = lifecycle
        self.edited: set[int] = set()  # requests whose tail the current commit replaced

    def commit(self, step: LaunchedStep) -> set[int]:
        """Accept `step`'s tokens and settle each of its requests (see the module docstring).
        A failure nobody in particular can be blamed for fails the step's requests only.

        Returns the ids of the requests whose sequence changed beyond their new token
        (jump-forward, a rollback): a step launched before this commit ran a stale token for
        them and must drop it."""
        self.edited = set()
        batch = step.batch
        # handled when they finished (only an overlapped step can hold such requests: an abort,
        # or a finish at the commit of the step before it)
        settled = {id(r) for r in batch.reqs if r.finished} if step.overlapped else set()
        try:
            try:
                out = self.executor.resolve(step.sample) if step.sample is not None else None
            except Exception:
                self.drop_drafts(step)
                raise
            finally:
                if step.overlapped:
                    for r in batch.sampling_reqs:
                        r.pending_sample = False
            # NOTE: when verification raises it has dropped every draft itself
            verified = self.verifier.verify(batch, step.logits) if self.verifier is not None else []
            for row, v in verified:
                self._append_verified(row, v)
            if out is not None:
                # a request that finished before its token arrived drops the token, and so does
                # one whose sequence changed after the token this step ran (stale)
                self.accept_all(batch.sampling_reqs, out, skip=(settled | step.stale) or None)
        except Exception as e:  # NOTE: the loop must survive; fail this batch's requests only
            log_internal_error("the step's results", e)
            self.lifecycle.fail(batch.reqs, e)
            return self.edited
        finally:
            self.free_branch_rows(step)
        plan = batch.plan
        stepped: list[Req] = []
        for r, start, n in zip(plan.reqs, plan.starts, plan.extend_lens, strict=True):
            if settled and id(r) in settled:
                continue
            if r.finished:
                self.lifecycle.release(r)
            elif n > 1 and start < len(r.origin_input_ids) and r.req_pool_idx is not None:
                # a prompt chunk ran: share what this step computed with later requests (under
                # overlap `kv_len` counts the next step's token too)
                self.cache.cache_unfinished_req(r, start + n)
            r.steps_since_stream += 1
            stepped.append(r)
        self.lifecycle.emit(stepped)
        return self.edited

    def drop_drafts(self, step: LaunchedStep) -> None:
        """A step failing before verification: its drafted rows keep the KV of their real tokens
        only (the batch's requests are failed next, so their KV must match their tokens)."""
        if self.verifier is None:
            return
        for row in step.plan.drafted_rows:
            self.verifier.keep_kv(row, [])

    def free_branch_rows(self, step: LaunchedStep) -> None:
        for spare in step.branch_rows:
            self.req_to_token_pool.free(spare)
        step.branch_rows = []

    # --- tokens -------------------------------------------------------------------------------

    def accept_all(self, reqs: list[Req], out: SampleOutput, skip: set[int] | None = None) -> None:
        """Accept row i of `out` for reqs[i], except the requests whose id() is in `skip`."""
        for i, r in enumerate(reqs):
            if skip is not None and id(r) in skip:
                continue
            try:
                self._accept_sampled(r, out, i)
            except Exception as e:  # NOTE: fail this request only (released by the caller)
                log_internal_error(f"accepting the token of request {r.rid}", e)
                if not r.finished:
                    r.finish(internal_error(e))

    def _accept_sampled(self, r: Req, out: SampleOutput, i: int) -> None:
        """Append request r's sampled token (row i of `out`), advance its grammar, check finish."""
        if r.sampling_params.max_new_tokens == 0:
            r.finish(FinishReason.length(0))
            return
        self._append_token(r, out.next_ids[i], out.logprobs[i], out.top_logprobs[i])
        if not r.finished and r.grammar is not None:
            self._jump_forward(r)

    def _append_verified(self, row: StepRow, v: Verified) -> None:
        """Append a drafted request's verified tokens as sampled ones, then settle its KV."""
        assert self.verifier is not None
        r = row.req
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
            self.verifier.keep_kv(row, v.path[: max(appended - 1, 0)])
        if edit is None:
            return
        try:
            self._apply_jump(r, edit)
        except Exception as e:  # NOTE: fail this request only (released by the caller)
            log_internal_error(f"applying the jump-forward of request {r.rid}", e)
            r.finish(internal_error(e))

    def _append_token(
        self, r: Req, tok: int, lp: float | None, top: list[tuple[float, int]] | None
    ) -> None:
        """Append one chosen token (sampled, or verified from a draft); advance the grammar and
        check finish."""
        if not r.output_ids and r.first_token_delay is None and r.arrival_time:
            r.first_token_delay = max(0.0, time.time() - r.arrival_time)
        r.output_ids.append(tok)
        self.stats.generated_tokens += 1
        if r.return_logprob:
            r.output_token_logprobs.append((lp, tok))
            if r.top_logprobs_num:
                r.output_top_logprobs.append(top)
        if self.grammars is not None and r.grammar is not None:
            self.grammars.accept(r, tok)
            if r.value_checker is not None and not r.finished and self._check_values(r):
                return
        check_finish(r, self.limits.eos_token_ids, self.limits.context_length, self.tokenizer)

    # --- jump-forward and the checked layer ---------------------------------------------------

    def _jump_forward(self, req: Req) -> None:
        """Let the grammar append the text it forces (no model step) and apply its edit."""
        edit = self._find_jump(req)
        if edit is not None:  # else nothing forced, or the request was finished (state lost)
            self._apply_jump(req, edit)

    def _find_jump(self, req: Req) -> JumpForwardEdit | None:
        """The grammar's forced-text edit (already accepted by the grammar: apply it)."""
        assert self.grammars is not None
        sp = req.sampling_params
        room = self.limits.context_length - len(req.origin_input_ids)
        return self.grammars.jump_forward(req, min(sp.max_new_tokens, room) - 1)

    def _apply_jump(self, req: Req, edit: JumpForwardEdit) -> None:
        self._replace_output_tail(req, edit.keep, edit.tokens)
        req.jump_forward_tokens += edit.added
        self.stats.jump_forward_tokens += edit.added
        if req.value_checker is not None:
            self._check_values(req)

    def _check_values(self, r: Req) -> bool:
        """The checked layer (runtime/constrained/value_checker.py): validate the values the
        new tokens complete; on a failure roll the request back to where the value starts and
        ban that token there, or past the bound end it with an abort naming the keyword.
        True when the output was rolled back (its last token is gone: no finish check)."""
        checker, grammar = r.value_checker, r.grammar
        assert checker is not None and grammar is not None
        failure = checker.advance(r.output_ids, grammar.is_terminated())
        if failure is None:
            return False
        k = checker.retry_position(failure, len(r.output_ids))
        if k is not None and checker.note_rollback(k, r.output_ids[k]):
            self._roll_back_output(r, k)
            return True
        self._roll_back_output(r, failure.token_index)  # the failed value is never sent
        r.finish(
            FinishReason.abort(
                f"json_schema: the output kept breaking '{failure.keyword}' at "
                f"{failure.pointer or '/'}; no valid continuation found after "
                f"{checker.total_rollbacks} rollbacks",
                400,
            )
        )
        return True

    def _roll_back_output(self, r: Req, k: int) -> None:
        """Cut the output to its first k tokens: grammar, KV (token k-1 is recomputed, so the
        next step samples token k), logprobs and the checker's state."""
        assert r.grammar is not None and r.value_checker is not None
        r.grammar.rollback(len(r.output_ids) - k)
        del r.output_token_logprobs[k:]
        del r.output_top_logprobs[k:]
        if k > 0:
            self._replace_output_tail(r, k - 1, [r.output_ids[k - 1]])
        else:
            self._replace_output_tail(r, 0, [])

    def _replace_output_tail(self, req: Req, keep: int, new_tokens: list[int]) -> None:
        """Replace output_ids[keep:] by `new_tokens` (jump-forward after retokenization).

        KV of the replaced tokens is dropped so the next step recomputes them as one extend; tokens
        already streamed are reported as rolled back so the detokenizer re-derives their text.
        """
        keep_pos = len(req.origin_input_ids) + keep
        assert keep_pos >= req.cache_protected_len, "cannot roll back into shared cache"
        self.edited.add(id(req))
        if req.kv_len > keep_pos and req.req_pool_idx is not None:
            page = self.kv_pool.page_size
            first_free = -(-keep_pos // page) * page  # keep a shared tail page
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
            if req.kv_len > first_free:
                self.kv_pool.free(row[first_free : req.kv_len].clone())
            req.kv_len = keep_pos
        del req.output_ids[keep:]
        req.output_ids.extend(new_tokens)
        if req.value_checker is not None:
            req.value_checker.truncate(keep, req.output_ids)
        req.draft_state = None  # its n-gram index holds the replaced tokens
        if req.stop_regex is not None:
            req.stop_regex.reset()
        if keep < req.sent_output_len:
            req.rollback_pending += req.sent_output_len - keep
            req.sent_output_len = keep
