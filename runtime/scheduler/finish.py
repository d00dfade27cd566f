"""When a request stops: EOS, stop token ids, length, context end, grammar end, stop strings,
stop_regex (runtime/text/stop_regex.py).

Runs in the scheduler after each sampled token. Stop strings are found by decoding only the tail
of the output (enough tokens to cover the longest stop string), so the check is cheap per step;
the detokenizer then trims the matched text.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from radixgen.finish_reason import FinishReason
from radixgen.runtime.text.stop_regex import StopRegexTimeout

if TYPE_CHECKING:
    from radixgen.runtime.scheduler.interfaces import TextDecoder
    from radixgen.runtime.scheduler.req import Req


def check_finish(
    req: Req, eos_ids: Collection[int], context_length: int, tokenizer: TextDecoder
) -> None:
    sp = req.sampling_params
    tok = req.output_ids[-1]
    if not sp.ignore_eos and tok in eos_ids:
        req.finish(FinishReason.stop(tok))
        return
    if tok in sp.stop_token_ids:
        req.finish(FinishReason.stop(tok))
        return
    if req.grammar is not None and req.grammar.is_terminated():
        req.finish(FinishReason.stop(tok))
        return
    if sp.stop and len(req.output_ids) >= sp.min_new_tokens:
        matched = _match_stop_string(req, tokenizer)
        if matched is not None:
            req.finish(FinishReason.stop(matched))
            return
    if req.stop_regex is not None and len(req.output_ids) >= sp.min_new_tokens:
        try:
            pattern = req.stop_regex.search(req.output_ids, tokenizer)
        except StopRegexTimeout as e:
            req.finish(FinishReason.abort(str(e), 400))
            return
        if pattern is not None:
            req.finish(FinishReason.stop_regex(pattern))
            return
    if len(req.output_ids) >= sp.max_new_tokens:
        req.finish(FinishReason.length(sp.max_new_tokens))
        return
    if req.seq_len >= context_length:
        req.finish(FinishReason.length(len(req.output_ids)))


def _match_stop_string(req: Req, tokenizer: TextDecoder) -> str | None:
    # Each token carries at least one byte (byte-level vocabularies may spell one character in
    # several tokens), so this many tail tokens cover any stop string ending at the newest token;
    # an earlier match would have finished the request at an earlier step.
    window = req.stop_tail_tokens
    tail = tokenizer.decode(req.output_ids[-window:], skip_special_tokens=False)
    for s in req.sampling_params.stop:
        if s in tail:
            return s
    return None
