"""The checks of one generate request and its tokenization (API process): every check that
can refuse a request runs here, before anything is sent to a scheduler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from radixgen.errors import InvalidRequestError, PromptTooLongError
from radixgen.grammar_limits import GrammarSpecLimits
from radixgen.io_struct import GenerateReqInput
from radixgen.runtime.request_side.request_limits import RequestLimits
from radixgen.runtime.text.tokenizer import Tokenizer
from radixgen.sampling_params import SamplingParams
from radixgen.server_args import SchedulerConfig

MAX_TOP_LOGPROBS = 100


@dataclass(frozen=True)
class RequestChecker:
    """What a request is checked against: the server's limits and the scheduler's sizes."""

    tokenizer: Tokenizer
    limits: RequestLimits
    grammar_limits: GrammarSpecLimits
    vocab_size: int
    context_length: int
    max_request_tokens: int  # prompt + max_new_tokens may not exceed this
    dp_size: int

    def check_request(self, obj: GenerateReqInput) -> SamplingParams:
        """The cheap checks of one request, before any tokenizing: prompt shape and size, sampling
        params, stop-string and logprob limits. Returns the parsed params."""
        if obj.text is not None and obj.input_ids is not None:
            raise InvalidRequestError("give either text or input_ids, not both", "text")
        if obj.text is not None:
            if not isinstance(obj.text, str):
                raise InvalidRequestError("text must be a string or a list of strings", "text")
            if not obj.text:
                # NOTE: checked on the text: tokenizers that add BOS would encode "" as [bos]
                raise InvalidRequestError("the prompt is empty", "text")
            self.limits.check_prompt_chars(len(obj.text), "text")
        elif obj.input_ids is not None:
            if not isinstance(obj.input_ids, list):
                raise InvalidRequestError("input_ids must be a list of token ids", "input_ids")
        else:
            raise InvalidRequestError("a prompt is required: text or input_ids", "text")
        params = obj.sampling_params
        if isinstance(params, list):  # one item of a batch carries its own object
            raise InvalidRequestError("sampling_params must be an object", "sampling_params")
        sp = SamplingParams.from_dict(params, self.grammar_limits)
        sp.verify_vocab(self.vocab_size)
        self.limits.check_stop_strings(sp.stop)
        self.limits.check_stop_regexes(sp.stop_regex)
        dp_rank, dp_size = obj.data_parallel_rank, self.dp_size
        if dp_rank is not None and not 0 <= dp_rank < dp_size:
            raise InvalidRequestError(
                f"data_parallel_rank must be in [0, {dp_size - 1}] (--dp-size {dp_size}), "
                f"got {dp_rank}",
                "data_parallel_rank",
            )
        top = obj.top_logprobs_num or 0
        if not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {top!r}",
                "top_logprobs_num",
            )
        return sp

    def tokenize_one(self, obj: GenerateReqInput, sp: SamplingParams) -> list[int]:
        """The prompt ids of a checked request, with the checks that need them (raises on bad
        input). CPU work: `generate` runs it in a worker thread."""
        if obj.text is not None:
            assert isinstance(obj.text, str)  # check_request ran first
            ids = self.tokenizer.encode(obj.text)
        else:
            ids = cast("list[int]", obj.input_ids)
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise InvalidRequestError("input_ids must be a list of token ids", "input_ids")
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"input_ids has token id {bad[0]} outside the vocabulary (0..{self.vocab_size - 1})",
                    "input_ids",
                )
        if not ids:
            raise InvalidRequestError(
                "the prompt is empty", "text" if obj.text is not None else "input_ids"
            )
        limit = self.max_request_tokens
        if len(ids) >= limit:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens; the maximum is {limit - 1} "
                f"(context length {self.context_length})",
                "text" if obj.text is not None else "input_ids",
            )
        if len(ids) + sp.max_new_tokens > limit:
            raise PromptTooLongError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({sp.max_new_tokens}) = "
                f"{len(ids) + sp.max_new_tokens} exceeds the context length of {limit} tokens",
                "max_new_tokens",
            )
        if obj.logprob_start_len is not None and obj.logprob_start_len != -1:
            if not isinstance(obj.logprob_start_len, int) or not 0 <= obj.logprob_start_len < len(
                ids
            ):
                raise InvalidRequestError(
                    f"logprob_start_len must be -1 or in [0, {len(ids) - 1}], got {obj.logprob_start_len}",
                    "logprob_start_len",
                )
        return ids


def resolve_priority(priority: int | None, cfg: SchedulerConfig) -> int:
    """The priority the scheduler gets, as SGLang resolves it: with priority scheduling on, the
    request's or --default-priority-value or 0; off, always 0 (a given priority is ignored, or
    refused under --abort-on-priority-when-disabled)."""
    if not cfg.enable_priority_scheduling:
        if priority is not None and cfg.abort_on_priority_when_disabled:
            raise InvalidRequestError(
                "priority is given but priority scheduling is off (--enable-priority-scheduling); "
                "this server refuses it (--abort-on-priority-when-disabled)",
                "priority",
            )
        return 0
    if priority is not None:
        return priority
    return cfg.default_priority_value if cfg.default_priority_value is not None else 0
