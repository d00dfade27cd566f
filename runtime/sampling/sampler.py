"""Turn a batch's logits into next tokens and logprobs, vectorised across requests (scheduler process).

Order per step: raw logprobs (for requests that asked) -> logit bias -> min_new_tokens (stop
tokens masked) -> penalties -> grammar mask -> greedy argmax or temperature / top-k / top-p /
min-p sampling with one per-request uniform. Only features some request in the batch uses cost
anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgen.kernels.sampling import apply_penalties, sample_from_probs
from radixgen.sampling_params import TOP_K_DISABLED

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.model_runner import LogitsOutput
    from radixgen.runtime.scheduler.req import Req


@dataclass
class SampleOutput:
    next_ids: list[int]
    logprobs: list[float | None]  # chosen token's logprob, for rows that asked
    top_logprobs: list[list[tuple[float, int]] | None]


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids

    def sample(
        self,
        logits: LogitsOutput,
        rows: list[int],
        reqs: list[Req],
        grammar_mask: torch.Tensor | None = None,
        grammar_rows: torch.Tensor | None = None,
    ) -> SampleOutput:
        """One token per request; request i reads logits row `rows[i]`.

        Plain greedy requests (no logprobs, penalties, bias or pending min_new_tokens) take the
        native argmax straight from the model-dtype logits, under their grammar mask if they have
        one; only the others get a float32 copy of their rows. `grammar_rows` index into `reqs`.
        """
        b = len(reqs)
        plain = [i for i, r in enumerate(reqs) if self._plain_greedy(r)]
        ids = [0] * b
        lps: list[float | None] = [None] * b
        tops: list[list[tuple[float, int]] | None] = [None] * b
        mask_row: dict[int, int] = {}
        if grammar_mask is not None and grammar_rows is not None:
            mask_row = {int(g): j for j, g in enumerate(grammar_rows.tolist())}
        free = [i for i in plain if i not in mask_row]
        masked = [i for i in plain if i in mask_row]
        if free:
            for i, tok in zip(free, logits.greedy([rows[i] for i in free]), strict=True):
                ids[i] = tok
        if masked:
            sub_mask = grammar_mask[[mask_row[i] for i in masked]]
            for i, tok in zip(
                masked, logits.greedy([rows[i] for i in masked], sub_mask), strict=True
            ):
                ids[i] = tok
        if len(plain) == b:
            return SampleOutput(ids, lps, tops)
        plain_set = set(plain)
        rest = [i for i in range(b) if i not in plain_set]
        sub_rows = None
        if mask_row:
            keep = [(j, mask_row[i]) for j, i in enumerate(rest) if i in mask_row]
            if keep:
                sub_rows = torch.tensor([j for j, _ in keep], dtype=torch.long)
                grammar_mask = grammar_mask[[m for _, m in keep]]
            else:
                grammar_mask = None
        dense = logits.rows_float([rows[i] for i in rest])
        out = self._sample_dense(dense, [reqs[i] for i in rest], grammar_mask, sub_rows)
        for j, i in enumerate(rest):
            ids[i], lps[i], tops[i] = out.next_ids[j], out.logprobs[j], out.top_logprobs[j]
        return SampleOutput(ids, lps, tops)

    @staticmethod
    def _plain_greedy(r: Req) -> bool:
        sp = r.sampling_params
        return (
            sp.is_greedy
            and not r.return_logprob
            and not sp.logit_bias
            and not sp.frequency_penalty
            and not sp.presence_penalty
            and sp.repetition_penalty == 1.0
            and not (sp.min_new_tokens and len(r.output_ids) < sp.min_new_tokens)
        )

    def _sample_dense(
        self,
        logits: torch.Tensor,
        reqs: list[Req],
        grammar_mask: torch.Tensor | None,
        grammar_rows: torch.Tensor | None,
    ) -> SampleOutput:
        """logits: [B, V] float32, one row per request in `reqs` (modified in place)."""
        b = len(reqs)
        logits = logits[:, : self.vocab_size]
        want_lp = [r.return_logprob for r in reqs]
        raw_logprobs = None
        if any(want_lp):
            rows = [i for i, w in enumerate(want_lp) if w]
            raw_logprobs = (rows, torch.log_softmax(logits[rows], dim=-1))

        self._apply_bias_and_min_tokens(logits, reqs)
        if any(
            r.sampling_params.frequency_penalty
            or r.sampling_params.presence_penalty
            or r.sampling_params.repetition_penalty != 1.0
            for r in reqs
        ):
            self._apply_penalties(logits, reqs)
        if grammar_mask is not None:
            from radixgen.kernels.sampling import apply_token_bitmask

            apply_token_bitmask(logits, grammar_mask, grammar_rows)

        greedy = [r.sampling_params.is_greedy for r in reqs]
        next_ids = logits.argmax(dim=-1)
        if not all(greedy):
            rows = [i for i, g in enumerate(greedy) if not g]
            sub = [reqs[i] for i in rows]
            next_ids[rows] = self._sample_rows(logits[rows], sub)
        ids = next_ids.tolist()

        lps: list[float | None] = [None] * b
        tops: list[list[tuple[float, int]] | None] = [None] * b
        if raw_logprobs is not None:
            rows, lp = raw_logprobs
            chosen = lp.gather(1, next_ids[rows].unsqueeze(1)).squeeze(1).tolist()
            for j, i in enumerate(rows):
                lps[i] = chosen[j]
            k_max = max(reqs[i].top_logprobs_num for i in rows)
            if k_max > 0:
                vals, idx = lp.topk(k_max, dim=-1)
                vals_l, idx_l = vals.tolist(), idx.tolist()
                for j, i in enumerate(rows):
                    k = reqs[i].top_logprobs_num
                    tops[i] = list(zip(vals_l[j][:k], idx_l[j][:k], strict=True))
        return SampleOutput(ids, lps, tops)

    def _apply_bias_and_min_tokens(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        for i, r in enumerate(reqs):
            sp = r.sampling_params
            if sp.logit_bias:
                ids = torch.tensor(list(sp.logit_bias.keys()), dtype=torch.long)
                logits[i, ids] += torch.tensor(list(sp.logit_bias.values()), dtype=logits.dtype)
            # with a grammar, the grammar decides when the output may end
            if sp.min_new_tokens and len(r.output_ids) < sp.min_new_tokens and r.grammar is None:
                banned = set(sp.stop_token_ids)
                if not sp.ignore_eos:
                    banned.update(self.eos_token_ids)
                if banned:
                    logits[i, list(banned)] = float("-inf")

    def _apply_penalties(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        b, v = logits.shape
        rows: list[int] = []
        flat: list[int] = []
        for i, r in enumerate(reqs):
            rows.extend([i] * len(r.output_ids))
            flat.extend(r.output_ids)
        counts = torch.zeros(b * v, dtype=logits.dtype)
        if flat:
            index = torch.tensor(rows, dtype=torch.long) * v + torch.tensor(flat, dtype=torch.long)
            counts.index_add_(0, index, torch.ones(len(flat), dtype=logits.dtype))
        counts = counts.view(b, v)
        seen = None
        rep = torch.tensor([r.sampling_params.repetition_penalty for r in reqs], dtype=logits.dtype)
        if bool((rep != 1.0).any()):
            seen = counts > 0
            prompt_rows: list[int] = []
            prompt_ids: list[int] = []
            for i, r in enumerate(reqs):
                if r.sampling_params.repetition_penalty != 1.0:
                    prompt_rows.extend([i] * len(r.origin_input_ids))
                    prompt_ids.extend(r.origin_input_ids)
            if prompt_ids:
                seen[torch.tensor(prompt_rows), torch.tensor(prompt_ids)] = True
        freq = torch.tensor([r.sampling_params.frequency_penalty for r in reqs], dtype=logits.dtype)
        pres = torch.tensor([r.sampling_params.presence_penalty for r in reqs], dtype=logits.dtype)
        apply_penalties(logits, counts, seen, freq, pres, rep)

    def _sample_rows(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        params = [r.sampling_params for r in reqs]
        temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype)
        probs = torch.softmax(logits / temps[:, None], dim=-1)
        top_k = top_p = min_p = None
        if any(p.top_k < TOP_K_DISABLED for p in params):
            top_k = torch.tensor([min(p.top_k, self.vocab_size) for p in params], dtype=torch.long)
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype)
        if any(p.min_p > 0.0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=logits.dtype)
        uniforms = torch.tensor([r.uniform() for r in reqs], dtype=logits.dtype)
        return sample_from_probs(probs, uniforms, top_k, top_p, min_p)
