"""The scheduler's grammar manager: async compile, per-request matchers, batch masks, jump-forward.

Runs in the scheduler process. Each constrained request is served by one backend: the
configured one, or, for a JSON schema it cannot enforce exactly, the first fallback that can
(`schema_support`: llguidance behind xgrammar); fallbacks are built on their first use. Each
backend has its own compile pool and cache, so compiles are cached by (backend, kind, spec).
Compilation happens in a `CompilePool` (killable worker processes for xgrammar; fair queue,
deadline from the compile's start) behind a (kind, spec) cache bounded by memory, so the
scheduler thread never waits for a compile; `poll` hands over the requests whose grammar is
ready. Specs over the size/depth limits are refused before they reach the pool. Everything else (masks, accepting tokens, jump-forward) runs on
the scheduler thread inside a step, so it is kept to a few list operations per request.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from radixgen.errors import GrammarError
from radixgen.finish_reason import FinishReason
from radixgen.grammar_limits import GrammarSpecLimits, check_constraint
from radixgen.internal_state import GrammarStats
from radixgen.runtime.constrained.backend_choice import BackendChooser
from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarBackend, BaseGrammarObject
from radixgen.runtime.constrained.compile_cache import CompileCache, GrammarKey
from radixgen.runtime.constrained.compile_pool import (
    CompilePool,
    CompilePoolCounters,
    GrammarCompileTimeout,
)
from radixgen.runtime.constrained.jump_forward import plan_jump_forward
from radixgen.runtime.constrained.registry import create_grammar_backend
from radixgen.runtime.constrained.schema_checks import CheckPlan
from radixgen.runtime.constrained.value_checker import MAX_VALUE_ROLLBACKS, ValueChecker
from radixgen.runtime.constrained.vocab import GrammarVocab

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.text.tokenizer import Tokenizer
    from radixgen.server_args import GrammarConfig

logger = logging.getLogger(__name__)

# backends that compile a JSON schema after its exact rewrites (schema_rewrite.py)
REWRITING_BACKENDS = frozenset({"xgrammar", "llguidance"})


@dataclass(frozen=True)
class JumpForwardEdit:
    """A jump-forward's result for the scheduler: replace output_ids[keep:] by `tokens`.

    The grammar has already accepted `tokens`; `added` counts the tokens gained without a model
    step (a re-tokenization that merges tokens can shrink the tail: 0 then).
    """

    keep: int
    tokens: list[int]
    added: int


@dataclass
class GrammarCounters:
    """The manager's own counters since start (in `stats()`)."""

    grammar_compile_failures: int = 0
    grammar_backend_fallbacks: int = 0
    grammar_backend_compile_fallbacks: int = 0
    grammar_rejected_tokens: int = 0
    mask_fill_calls: int = 0
    mask_fill_rows: int = 0
    mask_fill_rows_unrestricted: int = 0
    mask_fill_seconds_total: float = 0.0
    jump_forward_calls: int = 0
    jump_forward_tokens: int = 0
    jump_forward_retokenized_tokens: int = 0
    jump_forward_tail_tokens_left: int = 0
    jump_forward_seconds_total: float = 0.0


@dataclass
class _PendingCompile:
    req: Req  # NOTE: held so that its id() cannot be reused by a new request while pending
    key: GrammarKey
    future: Future[Any]  # the backend's compiled grammar; the pool enforces the deadline
    backend: str
    fallbacks: list[str]  # backends that also enforce it exactly, tried if this compile fails
    rewrites: tuple[str, ...]  # the exact schema rewrites the schema backends apply
    checks: CheckPlan | None  # the checked layer's plan (value_checker.py), if any
    errors: list[tuple[str, str]] = field(default_factory=list)  # backends tried before: messages


class GrammarManager:
    """Owns the grammar backend of one scheduler; see runtime/scheduler/scheduler.py for calls."""

    def __init__(
        self,
        grammar_config: GrammarConfig,
        tokenizer: Tokenizer,
        vocab_size: int,
        eos_token_ids: list[int],
    ) -> None:
        self.config = grammar_config
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_token_ids = eos_token_ids
        self._vocab: GrammarVocab | None = None
        # NOTE: the vocabulary tables and the configured backend (importing xgrammar imports
        # transformers: ~1.2 s of a ~4 s start) are built on first use or by `start_warm_up`'s
        # thread, so a scheduler reports ready without them; the lock makes whoever comes first
        # build them and a step that needs them meanwhile wait for that build
        self._build_lock = threading.RLock()
        self.bitmask_words = (vocab_size + 31) // 32
        self.limits = GrammarSpecLimits.from_config(grammar_config)
        self._backends: dict[str, BaseGrammarBackend] = {}
        self._pools: dict[str, CompilePool] = {}
        self._caches: dict[str, CompileCache] = {}
        self.chooser = BackendChooser(
            grammar_config.grammar_backend, not grammar_config.disable_grammar_backend_fallback
        )
        self._pending: dict[int, _PendingCompile] = {}  # id(req) -> its compile
        self.max_value_rollbacks = MAX_VALUE_ROLLBACKS  # per output position (value_checker.py)
        self._probe_mask = torch.empty((1, self.bitmask_words), dtype=torch.int32)
        self._probe_words = self._probe_mask[0].numpy().view(np.uint32)  # same memory
        self._longer_probes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.counters = GrammarCounters()

    # --- lazily built parts ---------------------------------------------------------------------

    @property
    def vocab(self) -> GrammarVocab:
        """The tokenizer's byte tables; with jump-forward on, also which tokens longer ones
        extend (~0.2 s: built here, not in a decode step)."""
        vocab = self._vocab
        if vocab is None:
            with self._build_lock:
                if self._vocab is None:
                    built = GrammarVocab.from_tokenizer(
                        self._tokenizer, self._vocab_size, self._eos_token_ids
                    )
                    if not self.config.disable_jump_forward:
                        _ = built.extendable
                    self._vocab = built
                vocab = self._vocab
        return vocab

    @property
    def backend(self) -> BaseGrammarBackend:
        """The configured backend (built on first use)."""
        return self._backend(self.chooser.default)

    @property
    def pool(self) -> CompilePool:
        self._backend(self.chooser.default)
        return self._pools[self.chooser.default]

    @property
    def cache(self) -> CompileCache:
        self._backend(self.chooser.default)
        return self._caches[self.chooser.default]

    def warm_up(self) -> None:
        """Build the vocabulary tables and the configured backend now, and start its compile
        workers (the first constrained request then waits for neither)."""
        _ = self.backend
        self.pool.start()

    def start_warm_up(self) -> threading.Thread:
        """`warm_up` on a daemon thread (the scheduler's, once its start-up is reported)."""

        def run() -> None:
            try:
                self.warm_up()
            except Exception:  # NOTE: the first constrained request retries and reports it
                logger.exception("building the grammar backend in the background failed")

        thread = threading.Thread(target=run, name="grammar-warm-up", daemon=True)
        thread.start()
        return thread

    # --- compile ------------------------------------------------------------------------------

    def submit(self, req: Req) -> None:
        """Start (or join) the compile of the request's constraint; never blocks."""
        key = req.sampling_params.constraint
        assert key is not None, "submit() needs a constrained request"
        req.grammar_key = key
        names = [self.chooser.default]
        rewrites: tuple[str, ...] = ()
        checks: CheckPlan | None = None
        try:
            check_constraint(*key, self.limits)  # NOTE: the API checked too; this guards the pool
            names = self.choose_backends(key)
            rewrites, checks = self.chooser.plan(key)[1:]  # cached by choose_backends
            future = self._caches[names[0]].get(key)
        except GrammarError as e:
            future = Future()
            future.set_exception(e)
        except Exception as e:  # NOTE: a backend that fails to build: this request gets a 500
            logger.exception("the %s grammar backend could not be built", names[0])
            future = Future()
            future.set_exception(e)
        pending = _PendingCompile(req, key, future, names[0], names[1:], rewrites, checks)
        self._pending[id(req)] = pending
        self._set_backend(pending, names[0])

    def _set_backend(self, pending: _PendingCompile, name: str) -> None:
        req = pending.req
        req.grammar_backend = name
        # only the backends that compile the rewritten schema report its rewrites
        req.schema_rewrites = pending.rewrites if name in REWRITING_BACKENDS else ()
        checked = pending.checks is not None and name in REWRITING_BACKENDS
        req.schema_checks = pending.checks.keywords if checked and pending.checks else ()
        if name != self.chooser.default:
            self.counters.grammar_backend_fallbacks += 1

    def choose_backends(self, key: GrammarKey) -> list[str]:
        """The backends that serve this constraint exactly, best first (the first is built)."""
        self.backend.check_kind(key[0])  # other kinds: the configured backend's 400 naming it
        names = self.chooser.choose(key)
        self._backend(names[0])
        return names

    def _next_backend(self, pending: _PendingCompile, error: BaseException) -> bool:
        """After a failed compile, start the next exact backend's (True), if there is one.

        A library may refuse what our tables say it enforces (a pattern its regex dialect
        lacks, a bound it checks): the next backend gets its chance, and later requests of the
        spec go there first. Timeouts are final: the next compile would likely take as long.
        """
        final = isinstance(error, GrammarCompileTimeout) or not isinstance(error, GrammarError)
        if final or not pending.fallbacks:
            return False
        pending.errors.append((pending.backend, str(error)))
        name, pending.fallbacks = pending.fallbacks[0], pending.fallbacks[1:]
        self.chooser.demote(pending.key, [name, *pending.fallbacks])
        self._backend(name)
        pending.backend, pending.future = name, self._caches[name].get(pending.key)
        self._set_backend(pending, name)
        self.counters.grammar_backend_compile_fallbacks += 1
        return True

    @staticmethod
    def _all_failed(pending: _PendingCompile, last: BaseException) -> GrammarError:
        """One 400 for a spec every exact backend failed to compile: the first backend's message
        (it starts "invalid <kind>: "), then the others' where they differ."""
        tried = [*pending.errors, (pending.backend, str(last))]
        first = tried[0][1]
        others = [f"{name}: {msg}" for name, msg in tried[1:] if msg != first]
        text = first if not others else f"{first} (also tried {'; '.join(others)})"
        return GrammarError(text, pending.key[0])

    def _backend(self, name: str) -> BaseGrammarBackend:
        """The named backend with its compile pool and cache, built on first use."""
        backend = self._backends.get(name)
        if backend is not None:
            return backend
        with self._build_lock:
            return self._build_backend(name)

    def _build_backend(self, name: str) -> BaseGrammarBackend:
        backend = self._backends.get(name)
        if backend is None:
            start = time.perf_counter()
            backend = create_grammar_backend(name, self.vocab, self.config)
            pool = CompilePool(backend, self.config)
            self._pools[name] = pool
            self._caches[name] = CompileCache(
                pool.submit,
                functools.partial(self._compiled_size, backend),
                self.config.grammar_cache_max_bytes,
            )
            self._backends[name] = backend
            logger.info("grammar backend %s ready in %.2f s", name, time.perf_counter() - start)
        return backend

    def poll(self, reqs: list[Req]) -> tuple[list[Req], list[Req]]:
        """Split waiting requests into (ready: grammar set, failed: finished with a 400 abort)."""
        ready: list[Req] = []
        failed: list[Req] = []
        for pool in list(self._pools.values()):
            pool.expire_overruns()
        for req in reqs:
            pending = self._pending.get(id(req))
            if pending is None:  # not submitted through us (should not happen): do it now
                self.submit(req)
                continue
            if pending.future.done():
                error = (
                    GrammarError("the grammar compiler is shutting down", pending.key[0])
                    if pending.future.cancelled()
                    else pending.future.exception()
                )
                cancelled = pending.future.cancelled()
                if error is not None and not cancelled and self._next_backend(pending, error):
                    continue  # the next backend's compile is under way
                del self._pending[id(req)]
                if error is not None and pending.errors:
                    error = self._all_failed(pending, error)
                if error is None:
                    try:
                        backend = self._backends[pending.backend]
                        req.grammar = backend.create_grammar(pending.future.result())
                        if pending.checks is not None and req.schema_checks:
                            req.value_checker = ValueChecker(
                                pending.checks, self.vocab.token_bytes, self.max_value_rollbacks
                            )
                    except Exception as e:  # a library failure must cost only this request
                        logger.exception("creating a matcher for %s failed", req.rid)
                        error = e
                if error is None:
                    ready.append(req)
                else:
                    self._fail(req, error)
                    failed.append(req)
        self.drop_pending_except(reqs)
        return ready, failed

    def drop_pending_except(self, reqs: list[Req]) -> None:
        """Forget the compiles of requests no longer waiting (aborted while they waited).

        Runs at each poll, so they last until the next constrained request arrives at most.
        """
        # NOTE: not a size comparison: requests that settled in this poll already left _pending,
        # so an aborted one can hide behind them (len(_pending) == len(reqs))
        alive = {id(r) for r in reqs}
        if any(k not in alive for k in self._pending):
            self._pending = {k: v for k, v in self._pending.items() if k in alive}

    @staticmethod
    def _compiled_size(backend: BaseGrammarBackend, compiled: Any) -> int:
        try:
            return backend.compiled_size_bytes(compiled)
        except Exception:  # a size we cannot read must not lose the grammar
            return backend.estimated_compiled_bytes

    def _fail(self, req: Req, error: BaseException) -> None:
        self.counters.grammar_compile_failures += 1
        if isinstance(error, GrammarError):
            message, status = str(error), 400
        else:
            kind = req.grammar_key[0] if req.grammar_key else "grammar"
            message, status = f"compiling the {kind} constraint failed: {error}", 500
        req.finish(FinishReason.abort(message, status))

    # --- per step -----------------------------------------------------------------------------

    def fill_mask(self, reqs: list[Req]) -> tuple[torch.Tensor, torch.Tensor]:
        """Bitmask rows for the constrained requests in `reqs` and their row indices.

        Rows whose mask allows every token are left out (nothing to apply). In a batch mixing
        backends each backend fills its own block of rows in one call; the row indices say which
        request each mask row is for (the sampler maps them, so no reordering copy is made).
        """
        start = time.perf_counter()
        groups: dict[str, tuple[list[int], list[BaseGrammarObject]]] = {}
        for i, r in enumerate(reqs):
            if r.grammar is not None:
                idx_g, grammars_g = groups.setdefault(
                    r.grammar_backend or self.chooser.default, ([], [])
                )
                idx_g.append(i)
                grammars_g.append(r.grammar)
        total = sum(len(g[0]) for g in groups.values())
        bitmask = torch.empty((total, self.bitmask_words), dtype=torch.int32)
        idx: list[int] = []
        restricts: list[bool] = []
        for name, (idx_g, grammars_g) in groups.items():
            block = bitmask[len(idx) : len(idx) + len(idx_g)]  # NOTE: contiguous rows
            restricts += self._backends[name].fill_bitmask(grammars_g, block)
            idx += idx_g
        for j, i in enumerate(idx):  # the checked layer's bans (a few requests, rarely any)
            checker = reqs[i].value_checker
            if checker is not None and checker.banned:
                bans = checker.bans_at(len(reqs[i].output_ids))
                if bans and _ban_tokens(bitmask[j], bans):
                    restricts[j] = True
        if not all(restricts):
            keep = [j for j, r in enumerate(restricts) if r]
            self.counters.mask_fill_rows_unrestricted += len(idx) - len(keep)
            bitmask = bitmask[keep]
            idx = [idx[j] for j in keep]
        rows = torch.tensor(idx, dtype=torch.long)
        c = self.counters
        c.mask_fill_calls += 1
        c.mask_fill_rows += len(restricts)
        c.mask_fill_seconds_total += time.perf_counter() - start
        return bitmask, rows

    def accept(self, req: Req, token_id: int) -> None:
        """Advance the request's matcher; a rejected token is a bug, so the request is aborted."""
        assert req.grammar is not None, "accept() is for constrained requests"
        if req.grammar.accept_token(token_id):
            return
        self.counters.grammar_rejected_tokens += 1
        logger.error(
            "grammar of request %s rejected sampled token %d (%r) after %d output tokens; "
            "the mask should have prevented it",
            req.rid,
            token_id,
            self.vocab.token_bytes[token_id] if 0 <= token_id < self.vocab.vocab_size else None,
            len(req.output_ids) - 1,
        )
        req.finish(
            FinishReason.abort(
                f"internal error: the grammar rejected sampled token {token_id}", 500
            )
        )

    def jump_forward(self, req: Req, max_output_len: int) -> JumpForwardEdit | None:
        """Advance the grammar over the text it forces next, re-tokenized at the boundary.

        Returns the edit of the request's output for the scheduler to apply (no model step), or
        None when there is nothing to jump. `max_output_len`: output tokens the request may
        hold afterwards (one fewer than it may generate, so it still samples its last token).

        NOTE: the grammar has already accepted the edit's tokens: the caller must apply it (or
        finish the request), or the matcher and `output_ids` disagree.
        """
        if self.config.disable_jump_forward or req.return_logprob:
            return None  # with logprobs, every output token needs its own model step
        grammar = req.grammar
        assert grammar is not None
        if grammar.is_terminated():
            return None
        forced = grammar.find_jump_forward_string()
        if not forced:
            return None
        start = time.perf_counter()
        try:
            return self._jump(req, grammar, forced, max_output_len)
        finally:
            self.counters.jump_forward_seconds_total += time.perf_counter() - start

    def _jump(
        self, req: Req, grammar: BaseGrammarObject, forced: str, max_len: int
    ) -> JumpForwardEdit | None:
        sp = req.sampling_params
        prompt_len = len(req.origin_input_ids)
        out = req.output_ids
        min_keep = max(0, req.cache_protected_len - prompt_len)
        plan = plan_jump_forward(out, forced, self.vocab, min_keep, max_len)
        if plan is None:
            return None
        if sp.stop_token_ids and not set(plan.tokens).isdisjoint(sp.stop_token_ids):
            return None  # finish checks see only the newest token: let the model emit stop ids
        if sp.stop and self._adds_stop_string(out, plan.keep, plan.tokens, sp.stop):
            return None
        replaced = out[plan.keep :]
        grammar.rollback(len(replaced))
        tokens = plan.tokens[:-1] if plan.last_may_grow else plan.tokens
        accepted = grammar.accept_tokens(tokens)
        ok = accepted == len(tokens)  # never append tokens the grammar would reject
        if ok and plan.last_may_grow:
            last = plan.tokens[-1]
            if not self._longer_token_allowed(grammar, last) and grammar.accept_token(last):
                tokens, accepted = plan.tokens, accepted + 1
            else:  # the model may merge it with what follows: let the model produce it
                self.counters.jump_forward_tail_tokens_left += 1
        if not ok or len(self.vocab.join(tokens)) <= plan.replaced_bytes:
            grammar.rollback(accepted)
            if grammar.accept_tokens(replaced) != len(replaced):
                logger.error("grammar of %s could not restore its state after a jump", req.rid)
                req.finish(FinishReason.abort("internal error: grammar state lost", 500))
            return None
        # tokens gained without a model step (a merge can also shrink the tail: count 0 then)
        added = max(0, len(tokens) - len(replaced))
        c = self.counters
        c.jump_forward_calls += 1
        c.jump_forward_tokens += added
        c.jump_forward_retokenized_tokens += len(replaced)
        return JumpForwardEdit(plan.keep, tokens, added)

    def _longer_token_allowed(self, grammar: BaseGrammarObject, token_id: int) -> bool:
        """Whether the grammar, here, allows a token that strictly extends `token_id`'s bytes."""
        probe = self._longer_probes.get(token_id)
        if probe is None:  # numpy, not torch: a handful of ids, where torch's per-op cost dominates
            ids = np.array(self.vocab.longer_tokens(token_id), dtype=np.int64)
            probe = self._longer_probes[token_id] = (ids >> 5, (ids & 31).astype(np.uint32))
        words, bits = probe
        if words.size == 0:
            return False
        grammar.fill_next_token_bitmask(self._probe_mask, 0)
        return bool(((self._probe_words[words] >> bits) & 1).any())

    def _adds_stop_string(
        self, out: list[int], keep: int, new: list[int], stops: list[str]
    ) -> bool:
        """Whether the appended text completes a stop string (the model must reach it itself)."""
        before = self.vocab.join(out[max(0, keep - 8) : keep])
        after = before + self.vocab.join(new)
        return any(s.encode() in after and s.encode() not in before for s in stops)

    # --- introspection ------------------------------------------------------------------------

    def stats(self) -> GrammarStats:
        """Counters for /server_info and metrics."""
        pools, caches = list(self._pools.values()), list(self._caches.values())
        summed = CompilePoolCounters()  # no backend built yet: 0s
        for pool in pools:  # over backends: counts summed, *_max the largest
            summed.add(pool.counters)
        own = self.counters
        return GrammarStats(
            grammar_compiles=summed.grammar_compiles,
            grammar_compile_seconds_total=summed.grammar_compile_seconds_total,
            grammar_compile_seconds_max=summed.grammar_compile_seconds_max,
            grammar_compile_queue_seconds_max=summed.grammar_compile_queue_seconds_max,
            grammar_compile_timeouts=summed.grammar_compile_timeouts,
            grammar_compile_worker_starts=summed.grammar_compile_worker_starts,
            grammar_compile_worker_start_seconds_max=summed.grammar_compile_worker_start_seconds_max,
            grammar_compile_worker_kills=summed.grammar_compile_worker_kills,
            grammar_compile_worker_crashes=summed.grammar_compile_worker_crashes,
            grammar_compile_errors=sum(c.errors for c in caches),
            grammar_compile_workers_alive=sum(len(p.worker_pids()) for p in pools),
            grammar_compile_queued=sum(p.queued() for p in pools),
            grammar_cache_hits=sum(c.hits for c in caches),
            grammar_cache_misses=sum(c.misses for c in caches),
            grammar_cache_entries=sum(len(c) for c in caches),
            grammar_cache_bytes=sum(c.bytes for c in caches),
            grammar_cache_evictions=sum(c.evictions for c in caches),
            grammar_waiting_compiles=len(self._pending),
            grammar_backends_built=len(self._backends),
            grammar_compile_failures=own.grammar_compile_failures,
            grammar_backend_fallbacks=own.grammar_backend_fallbacks,
            grammar_backend_compile_fallbacks=own.grammar_backend_compile_fallbacks,
            grammar_rejected_tokens=own.grammar_rejected_tokens,
            mask_fill_calls=own.mask_fill_calls,
            mask_fill_rows=own.mask_fill_rows,
            mask_fill_rows_unrestricted=own.mask_fill_rows_unrestricted,
            mask_fill_seconds_total=own.mask_fill_seconds_total,
            jump_forward_calls=own.jump_forward_calls,
            jump_forward_tokens=own.jump_forward_tokens,
            jump_forward_retokenized_tokens=own.jump_forward_retokenized_tokens,
            jump_forward_tail_tokens_left=own.jump_forward_tail_tokens_left,
            jump_forward_seconds_total=own.jump_forward_seconds_total,
        )

    def shutdown(self) -> None:
        """Stop the compile pool: queued compiles are cancelled, worker processes killed."""
        for pool in list(self._pools.values()):
            pool.shutdown()
        for backend in list(self._backends.values()):
            backend.shutdown()


def _ban_tokens(row: torch.Tensor, tokens: set[int]) -> bool:
    """Clear the banned tokens' bits in a bitmask row, unless that would leave no token (the
    model then repeats itself and the rollback bound ends the request). True if cleared."""
    words = row.numpy().view(np.uint32)  # same memory
    saved = words.copy()
    for tok in tokens:
        if 0 <= tok < words.size * 32:
            words[tok >> 5] &= np.uint32(~(1 << (tok & 31)) & 0xFFFFFFFF)
    if words.any():
        return True
    words[:] = saved
    return False
