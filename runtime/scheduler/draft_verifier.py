"""Speculative decoding's checking half: verify a step's drafts against its logits, learn from
them, and keep the KV of the accepted path (scheduler process).

Verification follows each tree from the root along the model's choices
(runtime/speculative/verify.py); the result processor appends the verified tokens one by one
through the same path as a sampled token (finish checks, grammar, jump-forward, which ends the
step's tokens as it would end a decode) and then asks `keep_kv` to keep the KV of the path it
kept and free the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.runtime.speculative.verify import Verified, VerifyItem, verify_drafts

if TYPE_CHECKING:
    from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from radixgen.runtime.model_executor.logits_output import LogitsOutput
    from radixgen.runtime.scheduler.draft_planner import DraftModels
    from radixgen.runtime.scheduler.schedule_batch import StepBatch
    from radixgen.runtime.scheduler.step_plan import StepRow
    from radixgen.runtime.speculative.draft_tree import StepDraft


@dataclass
class DraftVerifier:
    models: DraftModels
    kv_pool: TokenToKVPool
    req_to_token_pool: ReqToTokenPool

    def verify(self, batch: StepBatch, logits: LogitsOutput) -> list[tuple[StepRow, Verified]]:
        """Every drafted row with what verification gives it (counted and learnt from)."""
        items = batch.verify_rows
        if not items:
            return []
        self.models.stats.spec_verify_steps += 1
        try:
            results = verify_drafts(
                logits, [VerifyItem(row.req, _draft(row), rows) for row, rows in items]
            )
        except Exception:  # NOTE: the caller fails the batch: its KV must match its tokens
            for row, _ in items:
                self.keep_kv(row, [])
            raise
        out = []
        for (row, _), v in zip(items, results, strict=True):
            self._count(row, v)
            out.append((row, v))
        return out

    def _count(self, row: StepRow, v: Verified) -> None:
        tree = _draft(row)
        st = self.models.stats
        st.spec_verified_requests += 1
        st.spec_draft_tokens += len(tree)
        st.spec_accepted_tokens += len(v.path)
        st.spec_branch_tokens += tree.branch_tokens
        main = set(tree.chains[0]) if tree.chains else set()
        st.spec_branch_accepted_tokens += sum(1 for u in v.path if u not in main)
        if row.req.draft_state is not None:
            self._learn(row, tree, v.path)

    def _learn(self, row: StepRow, tree: StepDraft, path: list[int]) -> None:
        """Every node whose parent was accepted was tested: teach the acceptance model."""
        state = row.req.draft_state
        assert state is not None
        accepted = set(path)
        reached = {0, *path}
        for v in range(1, len(tree.tokens)):
            if tree.parents[v] in reached:
                self.models.accept.observe(
                    tree.depths[v], tree.match[v], tree.share[v], v in accepted, state.acceptance
                )

    def keep_kv(self, row: StepRow, kept: list[int]) -> None:
        """Keep the KV of the step's real tokens and of the draft nodes `kept` (the accepted
        path's nodes whose tokens were appended, the last appended token excepted: it was not
        an input of this step), in path order in the request's row; free every other draft slot
        (without branches, by position: with pages larger than one token, the last page stays
        whole)."""
        r, tree = row.req, _draft(row)
        end = row.start + row.extend_len
        root_end = end - row.draft_len  # the KV end with the step's real tokens
        keep = root_end + len(kept)
        if r.req_pool_idx is not None:
            if tree.branch_tokens:
                if kept:
                    slots = torch.tensor([tree.slots[v] for v in kept], dtype=torch.long)
                    self.req_to_token_pool.write_row(r.req_pool_idx, root_end, slots)
                mine = set(kept)
                unused = [tree.slots[v] for v in range(1, len(tree) + 1) if v not in mine]
                if unused:
                    self.kv_pool.free(torch.tensor(unused, dtype=torch.long))
            else:
                row_slots = self.req_to_token_pool.req_to_token[r.req_pool_idx]
                page = self.kv_pool.page_size
                first_free = -(-keep // page) * page
                if end > first_free:
                    self.kv_pool.free(row_slots[first_free:end].clone())
        r.kv_len = keep


def _draft(row: StepRow) -> StepDraft:
    assert row.draft is not None, "a verified row carries a draft"
    return row.draft
