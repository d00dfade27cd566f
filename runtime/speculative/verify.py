"""Verification of speculative draft trees against one step's logits (scheduler process).

A request with a draft tree ran its last token t (the root, node 0) and every draft node in the
step, so node v's logits row predicts the token after v's path. Each row is chosen exactly as
the non-speculative sampler would choose it in a decode step at that position: the native
refined argmax for plain greedy requests, the float32 rows (with raw logprobs) for requests
that return logprobs, under the grammar's bitmask of that node when the request is
constrained. The accepted path follows, from the root, the child whose token is the node's
choice while there is one; the tokens appended are the path's and the last node's choice (the
"bonus" token). Sampled requests draw every node's row with their own seeded uniform for that
output index (`verify_sampled`): the same tokens as without speculation, a valid rejection
sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from radixgen.kernels.device_io import to_device, upload
from radixgen.kernels.grammar_mask import apply_token_bitmask
from radixgen.kernels.sampling import sample_from_probs
from radixgen.sampling_params import TOP_K_DISABLED

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.logits_output import LogitsOutput
    from radixgen.runtime.scheduler.req import Req
    from radixgen.runtime.speculative.draft_tree import StepDraft


class VerifyItem(NamedTuple):
    """A request with a draft this step, its draft, and its logits rows (the root's first, then
    one per draft node)."""

    req: Req
    draft: StepDraft
    rows: list[int]


@dataclass
class Verified:
    """What verification gives one request: the tokens to append, in order, and their logprobs
    (for requests that return them)."""

    tokens: list[int]
    path: list[int]  # the accepted draft nodes: tokens[:-1] are theirs, the last is the bonus
    logprobs: list[float | None] | None = None
    top_logprobs: list[list[tuple[float, int]] | None] | None = None


def verify_greedy(logits: LogitsOutput, items: list[VerifyItem]) -> list[Verified]:
    """One `Verified` per item, in order. Every request is greedy."""
    choices: list[list[int] | None] = [None] * len(items)
    lp_info: list[tuple[list[float], list[list[tuple[float, int]]] | None] | None] = [None] * len(
        items
    )
    plain = [i for i, item in enumerate(items) if not item.req.return_logprob]
    free = [i for i in plain if items[i].draft.mask is None]
    masked = [i for i in plain if items[i].draft.mask is not None]
    if free:
        rows = [row for i in free for row in items[i].rows]
        _scatter(choices, free, items, logits.greedy(rows))
    if masked:
        rows = [row for i in masked for row in items[i].rows]
        mask = torch.cat([_mask(items[i].draft) for i in masked])
        _scatter(choices, masked, items, logits.greedy(rows, mask))
    for i, item in enumerate(items):
        if item.req.return_logprob:
            choices[i], lp_info[i] = _dense_rows(logits, item)
    out = []
    for i, item in enumerate(items):
        row_choices = choices[i]
        assert row_choices is not None
        v, used = _follow(item.draft, row_choices)
        info = lp_info[i]
        if info is not None:
            v.logprobs = [info[0][u] for u in used]
            v.top_logprobs = [info[1][u] for u in used] if info[1] is not None else None
        out.append(v)
    return out


def _mask(draft: StepDraft) -> torch.Tensor:
    assert draft.mask is not None
    return draft.mask


def _follow(tree: StepDraft, choices: list[int]) -> tuple[Verified, list[int]]:
    """The request's verified tokens given every node's choice, and the nodes whose choices
    they are (the root, then the path's nodes)."""
    path = tree.walk(choices)
    used = [0, *path]
    return Verified([choices[u] for u in used], path), used


def _scatter(
    choices: list[list[int] | None],
    which: list[int],
    items: list[VerifyItem],
    flat: list[int],
) -> None:
    at = 0
    for i in which:
        n = len(items[i].rows)
        choices[i] = flat[at : at + n]
        at += n


def _dense_rows(
    logits: LogitsOutput, item: VerifyItem
) -> tuple[list[int], tuple[list[float], list[list[tuple[float, int]]] | None]]:
    """The sampler's dense path for a greedy request that returns logprobs: raw logprobs of the
    float32 rows, the argmax under the grammar mask, the top-k of the raw logprobs."""
    r = item.req
    dense = logits.rows_float(item.rows)
    raw = torch.log_softmax(dense, dim=-1)
    if item.draft.mask is not None:
        apply_token_bitmask(dense, upload(item.draft.mask, dense.device))
    ids = dense.argmax(dim=-1)
    chosen = raw.gather(1, ids.unsqueeze(1)).squeeze(1).tolist()
    tops = None
    if r.top_logprobs_num:
        vals, idx = raw.topk(r.top_logprobs_num, dim=-1)
        tops = [
            list(zip(v, t, strict=True)) for v, t in zip(vals.tolist(), idx.tolist(), strict=True)
        ]
    return ids.tolist(), (chosen, tops)


def verify_drafts(logits: LogitsOutput, items: list[VerifyItem]) -> list[Verified]:
    """Greedy requests by `verify_greedy`, sampled ones by `verify_sampled`, results in order."""
    greedy = [i for i, item in enumerate(items) if item.req.sampling_params.is_greedy]
    if len(greedy) == len(items):
        return verify_greedy(logits, items)
    out: list[Verified | None] = [None] * len(items)
    for i, v in zip(greedy, verify_greedy(logits, [items[i] for i in greedy]), strict=True):
        out[i] = v
    for i, item in enumerate(items):
        if out[i] is None:
            out[i] = verify_sampled(logits, item)
    return [v for v in out if v is not None]


def verify_sampled(logits: LogitsOutput, item: VerifyItem) -> Verified:
    """Sampled requests: each row draws its token exactly as the sampler would at that position
    (grammar mask, temperature, top-k / top-p / min-p, the request's own seeded uniform for that
    output index), and the draft is accepted while the draws equal it. Against a point-mass
    draft this is rejection sampling (d is accepted with probability q(d), and on rejection the
    draw is q conditioned on not d), and more: the output is the very sample decoding without
    speculation would draw, whatever the batch."""
    r, tree = item.req, item.draft
    sp = r.sampling_params
    dense = logits.rows_float(item.rows)
    raw = torch.log_softmax(dense, dim=-1) if r.return_logprob else None
    if tree.mask is not None:
        apply_token_bitmask(dense, upload(tree.mask, dense.device))
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
    # node v draws output index base + depth(v): the draw decoding would make there
    uniforms = to_device([r.uniform_at(base + d) for d in tree.depths], dense.dtype, dev)
    choices: list[int] = sample_from_probs(probs, uniforms, top_k, top_p, min_p).tolist()
    v, used = _follow(tree, choices)
    if raw is not None:
        at = torch.tensor(used)
        picked = raw[at, torch.tensor(v.tokens)].tolist()
        v.logprobs = list(picked)
        if r.top_logprobs_num:
            vals, idx = raw[at].topk(r.top_logprobs_num, dim=-1)
            v.top_logprobs = [
                list(zip(a, b, strict=True))
                for a, b in zip(vals.tolist(), idx.tolist(), strict=True)
            ]
    return v
