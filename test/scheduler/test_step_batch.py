"""The decode step's batch (every request runs its last token) is built by a fast path; it must
equal what the general path builds for the same requests, pending sampled tokens included."""

from __future__ import annotations

import torch
from req_helpers import make_pools, make_req

from radixgen.runtime.scheduler.schedule_batch import (
    PENDING_TOKEN,
    build_step_batch,
    decode_step_batch,
    general_step_batch,
)
from radixgen.runtime.scheduler.step_plan import StepPlan


def decoding_reqs():
    """Three decodes: one right after its prompt, one with outputs, one whose last token is
    still on the device (overlap scheduling)."""
    reqs = [make_req("a", [5, 6, 7]), make_req("b", [8, 9]), make_req("c", [10, 11, 12, 13])]
    reqs[1].output_ids = [20, 21]
    reqs[2].output_ids = [30]
    reqs[2].pending_sample = True
    for row, r in enumerate(reqs):
        r.req_pool_idx = row + 1
        r.kv_len = r.seq_len - 1
    return reqs


def decode_plan(reqs):
    return StepPlan.of([(r, 1) for r in reqs])


def test_the_decode_path_builds_what_the_general_path_builds():
    reqs = decoding_reqs()
    slots = torch.tensor([40, 41, 42])
    pool_fast, _ = make_pools(64)
    pool_general, _ = make_pools(64)
    fast = decode_step_batch(decode_plan(reqs), slots, pool_fast)
    general = general_step_batch(decode_plan(reqs), slots, pool_general)
    assert fast.forward.input_ids.tolist() == [7, 21, PENDING_TOKEN]
    for name in ("input_ids", "positions", "out_cache_loc", "logits_indices"):
        assert torch.equal(getattr(fast.forward, name), getattr(general.forward, name)), name
    for name in ("req_pool_indices_cpu", "prefix_lens", "extend_lens", "extend_start_loc"):
        assert getattr(fast.forward, name) == getattr(general.forward, name), name
    assert fast.forward.draft_rows is None and general.forward.draft_rows is None
    assert fast.layouts == general.layouts
    assert fast.sample_rows == [0, 1, 2] and fast.sampling_reqs == reqs
    assert torch.equal(pool_fast.req_to_token, pool_general.req_to_token)
    assert pool_fast.req_to_token[2, 3].item() == 41  # request b's position 3 gets its slot


def test_a_prompt_chunk_in_the_step_takes_the_general_path():
    reqs = decoding_reqs()
    chunk = make_req("d", list(range(50, 60)))
    chunk.req_pool_idx, chunk.kv_len = 4, 0
    plan = StepPlan.of([*((r, 1) for r in reqs), (chunk, 4)])  # 4 of its 10 prompt tokens
    pool, _ = make_pools(64)
    batch = build_step_batch(plan, torch.arange(40, 47), pool)
    assert batch.forward.extend_lens == [1, 1, 1, 4]
    assert batch.forward.input_ids.tolist()[3:] == [50, 51, 52, 53]
    assert batch.sample_rows == [0, 1, 2]  # the chunk does not sample yet
