"""Build one step's `ForwardBatch` from the planned requests, and map logits rows back to them.

Runs in the scheduler process. Each row of the plan runs `extend_len` tokens of its request
starting at `start` (the request's `kv_len`); it samples when that reaches the end of its sequence, and asks for extra logits rows
when it wants prompt logprobs. A request with a speculative draft runs its draft tree's main
chain after its sequence's last token (counted in `extend_len`) and every other chain of the
tree as a pseudo-request after all requests: a spare request row whose first positions are its
parent chain's (runtime/speculative/draft_tree.py); each draft node gets a logits row.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.scheduler.req import Req
from radixgen.runtime.scheduler.step_plan import StepPlan, StepRow


@dataclass
class RowLayout:
    """Where a request's rows sit in the step's logits."""

    lp_start: int  # first prompt-logprob row
    lp_positions: list[int]  # prompt positions k whose logits give logprob of token k+1
    sample_row: int | None
    # speculative decoding: the rows of the step's last real token and of each draft-tree node,
    # by node id (the request then has no sample_row: runtime/speculative verifies it)
    verify_rows: list[int] | None = None


@dataclass
class StepBatch:
    plan: StepPlan
    forward: ForwardBatch
    layouts: list[RowLayout]

    @property
    def reqs(self) -> tuple[Req, ...]:
        return self.plan.reqs

    @cached_property
    def sample_rows(self) -> list[int]:
        return [lay.sample_row for lay in self.layouts if lay.sample_row is not None]

    @property
    def verify_rows(self) -> list[tuple[StepRow, list[int]]]:
        """The drafted rows, each with its logits rows (the root's, then one per draft node)."""
        return [
            (row, lay.verify_rows)
            for row, lay in zip(self.plan.rows, self.layouts, strict=True)
            if lay.verify_rows is not None
        ]

    @cached_property
    def sampling_reqs(self) -> list[Req]:
        return [
            r for r, lay in zip(self.reqs, self.layouts, strict=True) if lay.sample_row is not None
        ]


# stands for a token sampled on the device and not yet on the host (overlap scheduling): the
# step that reads it takes the real id from the device (`StepExecutor.launch`)
PENDING_TOKEN = -1


def token_slice(req: Req, start: int, end: int) -> list[int]:
    """all_ids[start:end] without concatenating the whole sequence; a pending sampled token
    (the position past all_ids) reads as PENDING_TOKEN."""
    p = len(req.origin_input_ids)
    if start >= p:
        out = req.output_ids[start - p : end - p]
    elif end <= p:
        return req.origin_input_ids[start:end]
    else:
        out = req.origin_input_ids[start:] + req.output_ids[: end - p]
    if req.pending_sample and end == req.seq_len:
        out = [*out, PENDING_TOKEN]
    return out


def build_step_batch(
    plan: StepPlan,
    out_cache_loc: torch.Tensor,
    req_to_token_pool: ReqToTokenPool,
    branch_slots: torch.Tensor | None = None,
) -> StepBatch:
    """`out_cache_loc` holds the freshly allocated KV slots of all rows' new tokens, in batch
    order; `branch_slots` those of the draft trees' branches (recorded in their drafts)."""
    if (
        branch_slots is None
        and plan.drafts is None
        and all(
            n == 1 and a + 1 == r.seq_len
            for r, a, n in zip(plan.reqs, plan.starts, plan.extend_lens, strict=True)
        )
    ):
        return decode_step_batch(plan, out_cache_loc, req_to_token_pool)
    return general_step_batch(plan, out_cache_loc, req_to_token_pool, branch_slots)


def general_step_batch(
    plan: StepPlan,
    out_cache_loc: torch.Tensor,
    req_to_token_pool: ReqToTokenPool,
    branch_slots: torch.Tensor | None = None,
) -> StepBatch:
    """`build_step_batch` for any mix of prompt chunks, decodes, drafts and prompt logprobs."""
    input_ids: list[int] = []
    positions: list[int] = []
    starts: list[int] = []
    prefix_lens: list[int] = []
    extend_lens: list[int] = []
    rows: list[int] = []
    logits_idx: list[int] = []
    layouts: list[RowLayout] = []
    draft_rows: list[bool] = []
    for step_row in plan.rows:
        req = step_row.req
        a, n = step_row.start, step_row.extend_len
        b = a + n
        start = len(input_ids)
        starts.append(start)
        prefix_lens.append(a)
        extend_lens.append(n)
        assert req.req_pool_idx is not None
        rows.append(req.req_pool_idx)
        drafted = step_row.draft_len
        draft_rows.append(drafted > 0)
        input_ids.extend(token_slice(req, a, b - drafted))
        if step_row.draft is not None:
            input_ids.extend(step_row.draft.main)
        positions.extend(range(a, b))
        lp_positions: list[int] = []
        lp_from = req.input_logprob_start
        prompt_len = len(req.origin_input_ids)
        if lp_from >= 0:
            lp_positions = list(range(max(a, lp_from), min(b, prompt_len - 1)))
        lay = RowLayout(len(logits_idx), lp_positions, None)
        logits_idx.extend(start + (k - a) for k in lp_positions)
        if drafted:
            assert b - drafted == req.seq_len, "a draft follows the sequence's last token"
            lay.verify_rows = list(range(len(logits_idx), len(logits_idx) + drafted + 1))
            logits_idx.extend(range(start + n - drafted - 1, start + n))
        elif b == req.seq_len:
            lay.sample_row = len(logits_idx)
            logits_idx.append(start + n - 1)
        layouts.append(lay)

    pos = torch.tensor(positions, dtype=torch.long)
    if len(positions) == len(rows):  # decode: one token a request (no torch op to spread rows)
        row_of_token = torch.tensor(rows, dtype=torch.long)
    else:
        row_of_token = torch.repeat_interleave(
            torch.tensor(rows, dtype=torch.long), torch.tensor(extend_lens)
        )
    req_to_token_pool.write(row_of_token, pos, out_cache_loc)
    if branch_slots is not None:
        for step_row, lay in zip(plan.rows, layouts, strict=True):
            if step_row.draft is not None and len(step_row.draft.chains) > 1:
                _add_branches(step_row, lay, req_to_token_pool, input_ids, positions, starts,
                              prefix_lens, extend_lens, rows, logits_idx)  # fmt: skip
        out_cache_loc = torch.cat([out_cache_loc, branch_slots])
        pos = torch.tensor(positions, dtype=torch.long)
        draft_rows += [True] * (len(rows) - len(draft_rows))  # the branches' pseudo-requests
    fb = ForwardBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long),
        positions=pos,
        out_cache_loc=out_cache_loc,
        req_pool_indices_cpu=rows,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        extend_start_loc=starts,
        logits_indices=torch.tensor(logits_idx, dtype=torch.long),
        draft_rows=draft_rows if any(draft_rows) else None,
    )
    return _step_batch(plan, fb, layouts)


def _step_batch(plan: StepPlan, fb: ForwardBatch, layouts: list[RowLayout]) -> StepBatch:
    reqs = plan.reqs
    if any(r.lora_id is not None for r in reqs):  # NOTE: speculation is refused with LoRA
        fb.lora_ids = [r.lora_id for r in reqs]
    return StepBatch(plan, fb, layouts)


def decode_step_batch(
    plan: StepPlan, out_cache_loc: torch.Tensor, req_to_token_pool: ReqToTokenPool
) -> StepBatch:
    """`build_step_batch` where every request decodes one token (its sequence's last) with no
    draft: the common step, built without the general path's per-request bookkeeping. A
    decode's position is past the prompt's last, so it never asks for prompt logprobs."""
    reqs = plan.reqs
    n = len(reqs)
    positions = list(plan.starts)
    rows = [row for r in reqs if (row := r.req_pool_idx) is not None]
    assert len(rows) == n, "a planned request holds a request row"
    input_ids = [
        PENDING_TOKEN
        if r.pending_sample
        else (r.output_ids[-1] if r.output_ids else r.origin_input_ids[-1])
        for r in reqs
    ]
    index = list(range(n))
    pos = torch.tensor(positions, dtype=torch.long)
    row_tensor = torch.tensor(rows, dtype=torch.long)
    req_to_token_pool.write(row_tensor, pos, out_cache_loc)
    fb = ForwardBatch(
        torch.tensor(input_ids, dtype=torch.long), pos, out_cache_loc, rows, positions,
        [1] * n, index, torch.arange(n, dtype=torch.long), draft_rows=None,
    )  # fmt: skip
    return _step_batch(plan, fb, [RowLayout(i, [], i) for i in index])


def _add_branches(
    step_row: StepRow,
    lay: RowLayout,
    pool: ReqToTokenPool,
    input_ids: list[int],
    positions: list[int],
    starts: list[int],
    prefix_lens: list[int],
    extend_lens: list[int],
    rows: list[int],
    logits_idx: list[int],
) -> None:
    """Append the pseudo-requests of a draft tree's branches: each chain's row starts with its
    parent chain's row up to the chain's first position, then its own slots. Records the main
    chain's slots in the draft (the branches' were recorded when they were allocated)."""
    req, tree = step_row.req, step_row.draft
    assert tree is not None and req.req_pool_idx is not None and lay.verify_rows is not None
    root = req.seq_len - 1  # the position of the tree's root, the request's last token
    main_row = pool.req_to_token[req.req_pool_idx]
    for v in tree.chains[0]:
        tree.slots[v] = int(main_row[root + tree.depths[v]])
    row_of = {v: req.req_pool_idx for v in tree.chains[0]}
    row_of[0] = req.req_pool_idx
    for chain, row in zip(tree.chains[1:], tree.branch_rows, strict=True):
        first = root + tree.depths[chain[0]]  # its first position: its prefix's length
        parent_row = row_of[tree.parents[chain[0]]]
        pool.write_row(row, 0, pool.req_to_token[parent_row, :first].clone())
        pool.write_row(row, first, torch.tensor([tree.slots[v] for v in chain], dtype=torch.long))
        start = len(input_ids)
        starts.append(start)
        prefix_lens.append(first)
        extend_lens.append(len(chain))
        rows.append(row)
        input_ids.extend(tree.tokens[v] for v in chain)
        positions.extend(range(first, first + len(chain)))
        lay.verify_rows.extend(range(len(logits_idx), len(logits_idx) + len(chain)))
        logits_idx.extend(range(start, start + len(chain)))
        row_of.update((v, row) for v in chain)


def allocate_step_slots(
    plan: StepPlan, kv_pool: TokenToKVPool, req_to_token: torch.Tensor
) -> torch.Tensor | None:
    """KV slots for every planned row's new tokens (None if the pool is short)."""
    if kv_pool.page_size == 1:
        return kv_pool.alloc(plan.tokens)
    last_locs = [
        int(req_to_token[r.req_pool_idx, a - 1]) if a > 0 else -1
        for r, a in zip(plan.reqs, plan.starts, strict=True)
    ]
    return kv_pool.alloc_extend(list(plan.starts), list(plan.extend_lens), last_locs)


def pages_needed(req: Req, n: int, page_size: int) -> int:
    """Fresh pages a request needs to grow by n tokens (its last page may have room)."""
    if page_size == 1:
        return n
    used = -(-req.kv_len // page_size)
    return -(-(req.kv_len + n) // page_size) - used
