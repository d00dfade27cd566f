"""Turn a step's results into messages: prompt logprobs per request, and the outputs to send.

Runs in the scheduler process. Non-streaming requests send once, when finished; streaming ones
send their new tokens every `stream_interval` steps (per-request override allowed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixgen.io_struct import BatchTokenIDOut, RequestMeta, TokenIDDelta
from radixgen.runtime.model_executor.logits_output import LogitsOutput
from radixgen.runtime.scheduler.req import Req
from radixgen.runtime.scheduler.schedule_batch import StepBatch


def record_input_logprobs(batch: StepBatch, logits: LogitsOutput) -> None:
    """Append this step's prompt logprobs to each request that asked for them."""
    for r, lay in zip(batch.reqs, batch.layouts, strict=True):
        if r.input_logprob_start < 0:
            continue
        if r.input_token_logprobs is None:
            start = r.input_logprob_start
            first = r.origin_input_ids[start] if start < len(r.origin_input_ids) else None
            r.input_token_logprobs = [] if first is None else [(None, first)]
            r.input_top_logprobs = [] if first is None else [None]
        # after a retraction the prompt is recomputed: skip positions already recorded
        next_pos = r.input_logprob_start + len(r.input_token_logprobs) - 1
        skip = sum(1 for k in lay.lp_positions if k < next_pos)
        positions = lay.lp_positions[skip:]
        if not positions:
            continue
        n = len(positions)
        row0 = lay.lp_start + skip
        lp = torch.log_softmax(logits.rows_float(slice(row0, row0 + n)), dim=-1)
        targets = [r.origin_input_ids[k + 1] for k in positions]
        index = torch.tensor(targets, device=lp.device)[:, None]
        vals = lp.gather(1, index).squeeze(1).tolist()
        r.input_token_logprobs.extend(zip(vals, targets, strict=True))
        if r.top_logprobs_num:
            assert r.input_top_logprobs is not None  # set with input_token_logprobs above
            tv, ti = lp.topk(r.top_logprobs_num, dim=-1)
            r.input_top_logprobs.extend(
                list(zip(v, i, strict=True)) for v, i in zip(tv.tolist(), ti.tolist(), strict=True)
            )


@dataclass
class OutputCollection:
    """The messages to send, and the requests whose entry could not be built (a bug)."""

    messages: list[BatchTokenIDOut]
    failed: list[tuple[Req, Exception]] = field(default_factory=list)


def collect_outputs(outbox: list[Req], stream_interval: int) -> OutputCollection:
    """One message with every request that has something to send (finished, or a stream chunk due).

    NOTE: each request's record is built before anything of it is committed, so a request whose
    record raises is reported in `failed` and the others are sent untouched.
    """
    result = OutputCollection([])
    if not outbox:
        return result
    seen: set[int] = set()
    deltas: list[TokenIDDelta] = []
    for r in outbox:
        if id(r) in seen:
            continue
        seen.add(id(r))
        try:
            delta = _delta(r, stream_interval)
        except Exception as e:
            result.failed.append((r, e))
            continue
        if delta is None:
            continue
        deltas.append(delta)
        r.steps_since_stream = 0
        r.rollback_pending = 0
        r.sent_stop_strings = True
        if r.return_logprob:
            r.sent_input_logprobs = True
        r.sent_output_len = len(r.output_ids)
    if deltas:
        result.messages.append(BatchTokenIDOut(deltas))
    return result


def _delta(r: Req, stream_interval: int) -> TokenIDDelta | None:
    """Request r's record of a BatchTokenIDOut, or None when nothing is due."""
    if not r.finished:
        every = r.sampling_params.stream_interval or stream_interval
        # the first tokens go out at once (time to first token), then every `every` steps
        first = r.sent_output_len == 0
        if (
            not r.stream
            or (r.steps_since_stream < every and not first)
            or len(r.output_ids) == r.sent_output_len
        ):
            return None
    sp = r.sampling_params
    sent = r.sent_output_len
    # NOTE: stop strings go out once, with the request's first message; the detokenizer
    # keeps them in its per-request state (a long stop list is not re-sent every chunk)
    stops_sent = r.sent_stop_strings
    delta = TokenIDDelta(
        r.rid,
        r.rollback_pending,
        r.output_ids[sent:],
        r.finished_reason,
        r.meta(),
        sp.skip_special_tokens,
        sp.spaces_between_special_tokens,
        sp.no_stop_trim,
        [] if stops_sent else sp.stop,
        [] if stops_sent else sp.stop_regex,
    )
    if r.return_logprob:
        # NOTE: one entry per output token (jump-forward, which adds tokens without a model
        # step, is off for these requests): a chunk's entries are exactly its new tokens'
        assert len(r.output_token_logprobs) == len(r.output_ids), "an output token has no logprob"
        first = not r.sent_input_logprobs
        delta.output_token_logprobs = r.output_token_logprobs[sent:]
        delta.output_top_logprobs = r.output_top_logprobs[sent:] if r.top_logprobs_num else None
        delta.input_token_logprobs = r.input_token_logprobs if first else None
        delta.input_top_logprobs = r.input_top_logprobs if first else None
    return delta


def failure_output(r: Req) -> BatchTokenIDOut:
    """A final message for a request failed after its record could not be built: no new tokens,
    its finish reason, counters that need nothing but its token lists."""
    assert r.finished_reason is not None
    meta = RequestMeta(len(r.origin_input_ids), len(r.output_ids), 0)
    sp = r.sampling_params
    delta = TokenIDDelta(
        r.rid, 0, [], r.finished_reason, meta, sp.skip_special_tokens,
        sp.spaces_between_special_tokens, True,
    )  # fmt: skip
    return BatchTokenIDOut([delta])
