"""One request's state inside the scheduler: tokens, KV ownership, sampling stream, logprobs, finish."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from radixgen.finish_reason import FinishReason
from radixgen.io_struct import LogprobList, RequestMeta, TokenizedGenerateReq, TopLogprobList
from radixgen.runtime.text.stop_regex import StopRegexMatcher
from radixgen.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixgen.runtime.constrained.base_grammar_backend import BaseGrammarObject
    from radixgen.runtime.constrained.value_checker import ValueChecker
    from radixgen.runtime.mem_cache.radix_cache import TreeNode
    from radixgen.runtime.speculative.policy import DraftState


class Req:
    """CPU-side state of a sequence being generated.

    KV ownership: positions [0, kv_len) of `all_ids` have KV in the pool, listed in row
    `req_pool_idx` of `req_to_token`; the first `cache_protected_len` of them belong to locked
    prefix-cache nodes, the rest to this request.
    """

    def __init__(self, msg: TokenizedGenerateReq, default_seed: int) -> None:
        self.rid = msg.rid
        self.origin_input_ids: list[int] = list(msg.input_ids)
        self.output_ids: list[int] = []
        self.sampling_params: SamplingParams = msg.sampling_params
        self.return_logprob = msg.return_logprob
        self.logprob_start_len = msg.logprob_start_len
        self.top_logprobs_num = msg.top_logprobs_num
        self.stream = msg.stream
        self.arrival_time = msg.arrival_time
        self.priority = msg.priority
        self.background = msg.background  # a Batch API line
        self.pin_prefix = msg.pin_prefix  # HiCache keeps its prompt in the host tier
        self.lora_id = msg.lora_path  # the LoRA adapter it runs under (None: the base model)
        # the prefix cache's namespace: the adapter's content digest, set on arrival (None: the
        # base model); by content, so a name reloaded with other weights starts a new one
        self.cache_namespace: str | None = None
        # the waiting-queue rank, smaller first: (tier: 0 interactive, 1 background, priority
        # key); the scheduler re-derives it under --schedule-low-priority-values-first
        self.rank: tuple[int, int] = (int(msg.background), -msg.priority)
        sp = msg.sampling_params
        # NOTE: decided once (the sampler asks every step, for every row): greedy with no
        # logprobs, bias or penalties takes the native argmax of the raw logits (until
        # min_new_tokens, which the sampler checks per step, is reached)
        self.plain_greedy = (
            sp.is_greedy
            and not msg.return_logprob
            and not sp.logit_bias
            and not sp.frequency_penalty
            and not sp.presence_penalty
            and sp.repetition_penalty == 1.0
        )
        self.constrained = sp.constraint is not None  # it needs a grammar (set once compiled)
        seed = msg.sampling_params.seed
        self.seed = (
            seed
            if seed is not None
            else random.Random(hash((default_seed, msg.rid))).getrandbits(62)
        )

        # KV ownership
        self.req_pool_idx: int | None = None
        self.kv_len = 0
        self.cache_protected_len = 0
        self.last_node: TreeNode | None = None  # the locked cache node (radix cache only)
        # the pool slot of its first prompt token (-1: not known yet; set at admission from
        # the cached prefix, or read once its KV exists): running requests on one prefix are
        # kept next to each other (cascade attention)
        self.prefix_first_slot = -1
        self.cached_tokens = 0  # prompt tokens served from the prefix cache (first admission)
        self.host_cached_tokens = 0  # of those, copied back from the host tier (HiCache)
        self.storage_cached_tokens = 0  # of those, read back from the file tier (HiCache)
        self.admitted_once = False

        # overlap scheduling: a token sampled for this request is still on its way to the host
        # (counted in seq_len, absent from output_ids; the next step reads it on the device)
        self.pending_sample = False
        # speculative decoding: the n-gram index of its own tokens and its acceptance record
        # (a step's draft travels in the step's plan)
        self.draft_state: DraftState | None = None

        # grammar
        self.grammar: BaseGrammarObject | None = None
        self.grammar_key: tuple[str, str] | None = None
        self.grammar_backend: str | None = None  # the backend that serves it (meta_info)
        self.schema_rewrites: tuple[str, ...] = ()  # the schema rewrites it compiles (meta_info)
        self.schema_checks: tuple[str, ...] = ()  # keywords the checked layer serves (meta_info)
        self.value_checker: ValueChecker | None = None  # only for schemas with checks
        self.jump_forward_tokens = 0

        # outputs
        self.finished_reason: FinishReason | None = None
        self.retractions = 0
        self.sent_output_len = 0  # output tokens already sent downstream
        self.rollback_pending = 0  # sent tokens since replaced (jump-forward retokenization)
        self.sent_input_logprobs = False
        self.sent_stop_strings = False  # the detokenizer keeps them from the first message on
        self.steps_since_stream = 0
        self.first_token_delay: float | None = None
        self.admit_time: float | None = None  # wall clock of the first admission (dashboard)
        self.input_token_logprobs: LogprobList | None = None
        self.input_top_logprobs: list[TopLogprobList | None] | None = None
        self.output_token_logprobs: LogprobList = []
        self.output_top_logprobs: list[TopLogprobList | None] = []
        # tokens to decode for the stop-string check: one byte per token at least, plus slack for
        # a match that starts inside a multi-byte token
        self.stop_tail_tokens = (
            max((len(s.encode("utf-8")) for s in self.sampling_params.stop), default=0) + 4
        )
        patterns = self.sampling_params.stop_regex
        self.stop_regex = StopRegexMatcher(patterns) if patterns else None

    # --- token views ------------------------------------------------------------------------

    @property
    def all_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids) + self.pending_sample

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def pending_len(self) -> int:
        """Tokens still to run through the model before the next sample (1 = a decode step)."""
        return self.seq_len - self.kv_len

    @property
    def input_logprob_start(self) -> int:
        """First prompt position whose logprob is reported, or -1."""
        if not self.return_logprob or self.logprob_start_len < 0:
            return -1
        return self.logprob_start_len

    def uniform(self) -> float:
        """This request's own random number for its current step (batch-independent)."""
        return self.uniform_at(len(self.output_ids))

    def uniform_at(self, index: int) -> float:
        """The random number that draws output token `index` (speculative verification draws
        several positions in one step)."""
        return random.Random(self.seed * 1_000_003 + index).random()

    # --- lifecycle --------------------------------------------------------------------------

    def release_kv(self) -> None:
        self.req_pool_idx = None
        self.kv_len = 0
        self.cache_protected_len = 0
        self.last_node = None

    def reset_for_retract(self) -> None:
        """Back to the waiting queue: all KV is released; output so far is kept and re-prefilled."""
        self.retractions += 1

    def finish(self, reason: FinishReason) -> None:
        if self.finished_reason is None:
            self.finished_reason = reason

    def meta(self) -> RequestMeta:
        return RequestMeta(
            prompt_tokens=len(self.origin_input_ids),
            completion_tokens=len(self.output_ids),
            cached_tokens=self.cached_tokens,
            host_cached_tokens=self.host_cached_tokens,
            storage_cached_tokens=self.storage_cached_tokens,
            jump_forward_tokens=self.jump_forward_tokens,
            retractions=self.retractions,
            first_token_delay=self.first_token_delay,
            queue_delay=(
                max(0.0, self.admit_time - self.arrival_time)
                if self.admit_time is not None and self.arrival_time
                else None
            ),
            grammar_backend=self.grammar_backend,
            schema_rewrites=self.schema_rewrites,
            schema_checks=self.schema_checks,
            schema_check_rollbacks=(
                self.value_checker.total_rollbacks if self.value_checker is not None else 0
            ),
        )

    def __repr__(self) -> str:
        return f"Req({self.rid}, in={len(self.origin_input_ids)}, out={len(self.output_ids)}, kv={self.kv_len})"
