"""Greedy verification of speculative drafts against one step's logits (scheduler process).

A request with draft d1..dk ran [t, d1..dk] in the step, so logits row i predicts the token
after d_i (row 0: after t). Each row is chosen exactly as the non-speculative sampler would
choose it in a decode step at that position: the native refined argmax for plain greedy
requests, the float32 rows (with raw logprobs) for requests that return logprobs, under the
grammar's bitmask of that position when the request is constrained. The accepted tokens are the
row choices up to and including the first that differs from the draft (the "bonus" token).
Sampled requests draw every row with their own seeded uniform for that output index
(`verify_sampled`): the same tokens as without speculation, a valid rejection sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.device_io import to_device, upload
from radixgen.kernels.grammar_mask import apply_token_bitmask
from radixgen.kernels.sampling import sample_from_probs
from radixgen.sampling_params import TOP_K_DISABLED

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.model_runner import LogitsOutput
    from radixgen.runtime.scheduler.req import Req


@dataclass
class Verified:
    """What verification gives one request: the tokens to append, in order, and their logprobs
    (for requests that return them)."""

    tokens: list[int]
    accepted_drafts: int  # how many of `tokens` are draft tokens (the last one is not)
    logprobs: list[float | None] | None = None
    top_logprobs: list[list[tuple[float, int]] | None] | None = None


def accept_prefix(choices: list[int], draft: list[int]) -> int:
    """Draft tokens confirmed by the row choices (choices[i] is the token after draft[:i])."""
    j = 0
    while j < len(draft) and choices[j] == draft[j]:
        j += 1
    return j


def verify_greedy(logits: LogitsOutput, items: list[tuple[Req, list[int]]]) -> list[Verified]:
    """One `Verified` per (request, its logits rows), in order. Every request is greedy."""
    choices: list[list[int] | None] = [None] * len(items)
    lp_info: list[tuple[list[float], list[list[tuple[float, int]]] | None] | None] = [None] * len(
        items
    )
    plain = [i for i, (r, _) in enumerate(items) if not r.return_logprob]
    free = [i for i in plain if items[i][0].draft_mask is None]
    masked = [i for i in plain if items[i][0].draft_mask is not None]
    if free:
        rows = [row for i in free for row in items[i][1]]
        _scatter(choices, free, items, logits.greedy(rows))
    if masked:
        rows = [row for i in masked for row in items[i][1]]
        mask = torch.cat([items[i][0].draft_mask for i in masked])
        _scatter(choices, masked, items, logits.greedy(rows, mask))
    for i, (r, rows) in enumerate(items):
        if r.return_logprob:
            choices[i], lp_info[i] = _dense_rows(logits, r, rows)
    out = []
    for i, (r, _) in enumerate(items):
        row_choices = choices[i]
        assert row_choices is not None
        j = accept_prefix(row_choices, r.draft)
        v = Verified(row_choices[: j + 1], j)
        info = lp_info[i]
        if info is not None:
            v.logprobs = list(info[0][: j + 1])
            v.top_logprobs = list(info[1][: j + 1]) if info[1] is not None else None
        out.append(v)
    return out


def _scatter(
    choices: list[list[int] | None],
    which: list[int],
    items: list[tuple[Req, list[int]]],
    flat: list[int],
) -> None:
    at = 0
    for i in which:
        n = len(items[i][1])
        choices[i] = flat[at : at + n]
        at += n


def _dense_rows(
    logits: LogitsOutput, r: Req, rows: list[int]
) -> tuple[list[int], tuple[list[float], list[list[tuple[float, int]]] | None]]:
    """The sampler's dense path for a greedy request that returns logprobs: raw logprobs of the
    float32 rows, the argmax under the grammar mask, the top-k of the raw logprobs."""
    dense = logits.rows_float(rows)
    raw = torch.log_softmax(dense, dim=-1)
    if r.draft_mask is not None:
        apply_token_bitmask(dense, upload(r.draft_mask, dense.device))
    ids = dense.argmax(dim=-1)
    chosen = raw.gather(1, ids.unsqueeze(1)).squeeze(1).tolist()
    tops = None
    if r.top_logprobs_num:
        vals, idx = raw.topk(r.top_logprobs_num, dim=-1)
        tops = [
            list(zip(v, t, strict=True)) for v, t in zip(vals.tolist(), idx.tolist(), strict=True)
        ]
    return ids.tolist(), (chosen, tops)


def verify_drafts(logits: LogitsOutput, items: list[tuple[Req, list[int]]]) -> list[Verified]:
    """Greedy requests by `verify_greedy`, sampled ones by `verify_sampled`, results in order."""
    greedy = [i for i, (r, _) in enumerate(items) if r.sampling_params.is_greedy]
    if len(greedy) == len(items):
        return verify_greedy(logits, items)
    out: list[Verified | None] = [None] * len(items)
    for i, v in zip(greedy, verify_greedy(logits, [items[i] for i in greedy]), strict=True):
        out[i] = v
    for i, (r, rows) in enumerate(items):
        if out[i] is None:
            out[i] = verify_sampled(logits, r, rows)
    return [v for v in out if v is not None]


def verify_sampled(logits: LogitsOutput, r: Req, rows: list[int]) -> Verified:
    """Sampled requests: each row draws its token exactly as the sampler would at that position
    (grammar mask, temperature, top-k / top-p / min-p, the request's own seeded uniform for that
    output index), and the draft is accepted while the draws equal it. Against a point-mass
    draft this is rejection sampling (d is accepted with probability q(d), and on rejection the
    draw is q conditioned on not d), and more: the output is the very sample decoding without
    speculation would draw, whatever the batch."""
    sp = r.sampling_params
    dense = logits.rows_float(rows)
    raw = torch.log_softmax(dense, dim=-1) if r.return_logprob else None
    if r.draft_mask is not None:
        apply_token_bitmask(dense, upload(r.draft_mask, dense.device))
    n, vocab = dense.shape
    dev = dense.device
    temps = to_device([sp.temperature] * n, dense.dtype, dev)
    probs = torch.softmax(dense / temps[:, None], dim=-1)
    top_k = top_p = min_p = None
    if sp.top_k < TOP_K_DISABLED:
        top_k = to_device([min(sp.top_k, vocab)] * n, torch.long, dev)
    if sp.top_p < 1.0:
        top_p = to_device([sp.top_p] * n, dense.dtype, dev)
    if sp.min_p > 0.0:
        min_p = to_device([sp.min_p] * n, dense.dtype, dev)
    base = len(r.output_ids)
    uniforms = to_device([r.uniform_at(base + i) for i in range(n)], dense.dtype, dev)
    choices: list[int] = sample_from_probs(probs, uniforms, top_k, top_p, min_p).tolist()
    j = accept_prefix(choices, r.draft)
    v = Verified(choices[: j + 1], j)
    if raw is not None:
        picked = raw[torch.arange(j + 1), torch.tensor(choices[: j + 1])].tolist()
        v.logprobs = list(picked)
        if r.top_logprobs_num:
            vals, idx = raw[: j + 1].topk(r.top_logprobs_num, dim=-1)
            v.top_logprobs = [
                list(zip(a, b, strict=True))
                for a, b in zip(vals.tolist(), idx.tolist(), strict=True)
            ]
    return v
