"""The scheduler's half of jump-forward: applying the grammar manager's edit to a request.

A scripted stand-in for the GrammarManager returns a chosen `JumpForwardEdit` at a chosen output
length; the toy runner then shows whether the scheduler dropped the replaced tokens' KV, ran the
new tokens as one extend, told the stream to roll back what it had sent, and counted the tokens.
"""

from __future__ import annotations

import torch
from toy_runner import make_scheduler, next_token, reference_output, run_to_end, submit

from radixgen.finish_reason import FinishReason
from radixgen.runtime.constrained.grammar_manager import JumpForwardEdit

PROMPT = [4, 8, 15, 16, 23, 42, 7, 3]


class _AllowAll:
    def is_terminated(self) -> bool:
        return False


class ScriptedGrammars:
    """Every constraint compiles at once to a grammar allowing every token; `script` maps a rid
    to (output length at which to jump, the edit to return then)."""

    def __init__(self, script: dict[str, tuple[int, JumpForwardEdit]]) -> None:
        self.script = script
        self.max_lens: list[int] = []

    def submit(self, req) -> None:
        pass

    def poll(self, reqs):
        for r in reqs:
            r.grammar = _AllowAll()
        return list(reqs), []

    def fill_mask(self, reqs):
        return torch.empty((0, 1), dtype=torch.int32), torch.empty(0, dtype=torch.long)

    def accept(self, req, token_id: int) -> None:
        pass

    def jump_forward(self, req, max_output_len: int) -> JumpForwardEdit | None:
        self.max_lens.append(max_output_len)
        at, edit = self.script.get(req.rid, (-1, None))
        return edit if len(req.output_ids) == at else None

    def stats(self) -> dict[str, float]:
        return {}


def continue_reference(prefix: list[int], total: int) -> list[int]:
    """The toy model's continuation of `prefix` (prompt + forced output) up to `total` outputs."""
    out = prefix[len(PROMPT) :]
    return out + reference_output(prefix, total - len(out))


def test_forced_tokens_replace_the_sampled_one_and_run_as_one_extend():
    edit = JumpForwardEdit(keep=0, tokens=[5, 6, 7], added=2)
    grammars = ScriptedGrammars({"r": (1, edit)})
    s, runner = make_scheduler(grammars=grammars)
    submit(s, "r", PROMPT, max_new_tokens=10, regex="x")
    out = run_to_end(s)
    ids, reason = out["r"]
    assert ids == continue_reference([*PROMPT, 5, 6, 7], 10)  # the sampled token is gone
    assert reason == FinishReason.length(10)
    assert [b.extend_lens for b in runner.batches[:2]] == [[len(PROMPT)], [3]]
    assert s.stats.jump_forward_tokens == 2
    # the request may hold max_new_tokens - 1 outputs after a jump: it samples its last token
    assert grammars.max_lens[0] == 9


def test_a_jump_into_streamed_tokens_rolls_them_back_and_frees_their_kv():
    t0 = next_token(PROMPT)
    edit = JumpForwardEdit(keep=1, tokens=[9, 9], added=0)  # replaces outputs 1 and 2
    s, _ = make_scheduler(grammars=ScriptedGrammars({"r": (3, edit)}))
    submit(s, "r", PROMPT, max_new_tokens=8, regex="x", stream=True)
    rollbacks, streamed = [], []
    while s.has_work or s.grammar_waiting:
        for batch in s.step():
            rollbacks.append(batch.deltas[0].rollback)
            if batch.deltas[0].rollback:
                del streamed[len(streamed) - batch.deltas[0].rollback :]
            streamed.extend(batch.deltas[0].new_token_ids)
            s.check_invariants()  # the replaced token's KV slot went back to the pool
    assert rollbacks.count(1) == 1 and sum(rollbacks) == 1  # output 1 had been sent: undo it
    assert streamed == continue_reference([*PROMPT, t0, 9, 9], 8)
    assert s.stats.jump_forward_tokens == 0  # a merge that does not grow the tail gains nothing
    assert s.kv_pool.available_size() + s.cache.evictable_size() == s.kv_pool.size
