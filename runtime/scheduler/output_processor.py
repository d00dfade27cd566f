"""Turn a step's results into messages: prompt logprobs per request, and the outputs to send.

Runs in the scheduler process. Non-streaming requests send once, when finished; streaming ones
send their new tokens every `stream_interval` steps (per-request override allowed).
"""

from __future__ import annotations

import torch

from radixgen.io_struct import BatchTokenIDOut
from radixgen.runtime.model_executor.model_runner import LogitsOutput
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
        vals = lp.gather(1, torch.tensor(targets)[:, None]).squeeze(1).tolist()
        r.input_token_logprobs.extend(zip(vals, targets, strict=True))
        if r.top_logprobs_num:
            assert r.input_top_logprobs is not None  # set with input_token_logprobs above
            tv, ti = lp.topk(r.top_logprobs_num, dim=-1)
            r.input_top_logprobs.extend(
                list(zip(v, i, strict=True)) for v, i in zip(tv.tolist(), ti.tolist(), strict=True)
            )


def collect_outputs(outbox: list[Req], stream_interval: int) -> list[BatchTokenIDOut]:
    """One message with every request that has something to send (finished, or a stream chunk due)."""
    if not outbox:
        return []
    seen: set[int] = set()
    out = BatchTokenIDOut([], [], [], [], [], [], [], [], [], [], [], [], [])
    for r in outbox:
        if id(r) in seen:
            continue
        seen.add(id(r))
        if not r.finished:
            every = r.sampling_params.stream_interval or stream_interval
            # the first tokens go out at once (time to first token), then every `every` steps
            first = r.sent_output_len == 0
            if (
                not r.stream
                or (r.steps_since_stream < every and not first)
                or len(r.output_ids) == r.sent_output_len
            ):
                continue
        r.steps_since_stream = 0
        sp = r.sampling_params
        new = r.output_ids[r.sent_output_len :]
        out.rids.append(r.rid)
        out.rollbacks.append(r.rollback_pending)
        r.rollback_pending = 0
        out.new_token_ids.append(new)
        out.finished_reasons.append(r.finished_reason)
        out.metas.append(r.meta())
        out.skip_special_tokens.append(sp.skip_special_tokens)
        out.spaces_between_special_tokens.append(sp.spaces_between_special_tokens)
        # NOTE: stop strings go out once, with the request's first message; the detokenizer
        # keeps them in its per-request state (a long stop list is not re-sent every chunk)
        out.stop_strings.append([] if r.sent_stop_strings else sp.stop)
        r.sent_stop_strings = True
        out.no_stop_trim.append(sp.no_stop_trim)
        if r.return_logprob:
            out.output_token_logprobs.append(r.output_token_logprobs[r.sent_output_len :])
            out.output_top_logprobs.append(
                r.output_top_logprobs[r.sent_output_len :] if r.top_logprobs_num else None
            )
            first = not r.sent_input_logprobs
            out.input_token_logprobs.append(r.input_token_logprobs if first else None)
            out.input_top_logprobs.append(r.input_top_logprobs if first else None)
            r.sent_input_logprobs = True
        else:
            out.output_token_logprobs.append(None)
            out.output_top_logprobs.append(None)
            out.input_token_logprobs.append(None)
            out.input_top_logprobs.append(None)
        r.sent_output_len = len(r.output_ids)
    return [out] if out.rids else []
