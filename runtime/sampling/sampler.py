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

from radixgen.kernels.device_io import HostCopy, to_device, upload
from radixgen.kernels.sampling import apply_penalties, apply_token_bitmask, sample_from_probs
from radixgen.sampling_params import TOP_K_DISABLED

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.logits_output import LogitsOutput
    from radixgen.runtime.scheduler.req import Req


@dataclass
class SampleOutput:
    next_ids: list[int]
    logprobs: list[float | None]  # chosen token's logprob, for rows that asked
    top_logprobs: list[list[tuple[float, int]] | None]


@dataclass
class _DenseSample:
    """What `_sample_dense` leaves on the device for the step's one transfer to the host."""

    next_ids: torch.Tensor  # [B]
    logprob_rows: list[int]  # rows that asked for logprobs
    chosen: torch.Tensor | None  # [len(logprob_rows)] the chosen tokens' logprobs
    top_vals: torch.Tensor | None  # [len(logprob_rows), k_max]
    top_ids: torch.Tensor | None
    top_nums: list[int]  # top_logprobs_num of each of logprob_rows


class PendingSample:
    """A step's sampled tokens: `device_ids` [B] on the logits' device at once (the next step's
    inputs can read them there), the host copies under way; `resolve` waits for them once."""

    def __init__(
        self,
        b: int,
        greedy_parts: list[tuple[list[int], torch.Tensor]],
        rest: list[int],
        dense: _DenseSample | None,
    ) -> None:
        self.b, self.rest, self.dense = b, rest, dense
        parts = list(greedy_parts)
        if dense is not None:
            parts.append((rest, dense.next_ids))
        if len(parts) == 1 and parts[0][0] == list(range(b)):
            self.device_ids = parts[0][1]
        else:
            dev = parts[0][1].device  # NOTE: b > 0 rows come from at least one part
            self.device_ids = torch.empty(b, dtype=torch.long, device=dev)
            for idx, t in parts:
                self.device_ids[to_device(idx, torch.long, dev)] = t.to(dev)
        logprob_parts = (dense.chosen, dense.top_vals, dense.top_ids) if dense else (None,) * 3
        self._copy = HostCopy(self.device_ids, *logprob_parts)

    def resolve(self) -> SampleOutput:
        """Wait for the host copies and lay them out per request."""
        ids_t, chosen, top_vals, top_ids = self._copy.wait()
        assert ids_t is not None
        ids: list[int] = ids_t.tolist()
        lps: list[float | None] = [None] * self.b
        tops: list[list[tuple[float, int]] | None] = [None] * self.b
        dense, rest = self.dense, self.rest
        if dense is not None and chosen is not None:
            for j, lp in zip(dense.logprob_rows, chosen.tolist(), strict=True):
                lps[rest[j]] = lp
        if dense is not None and top_vals is not None and top_ids is not None:
            vals_l, idx_l = top_vals.tolist(), top_ids.tolist()
            for j, k, v, t in zip(dense.logprob_rows, dense.top_nums, vals_l, idx_l, strict=True):
                tops[rest[j]] = list(zip(v[:k], t[:k], strict=True))
        return SampleOutput(ids, lps, tops)


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
        """`launch`, then wait for its results."""
        return self.launch(logits, rows, reqs, grammar_mask, grammar_rows).resolve()

    def launch(
        self,
        logits: LogitsOutput,
        rows: list[int],
        reqs: list[Req],
        grammar_mask: torch.Tensor | None = None,
        grammar_rows: torch.Tensor | None = None,
    ) -> PendingSample:
        """One token per request, left on the device; request i reads logits row `rows[i]`.

        Plain greedy requests (no logprobs, penalties, bias or pending min_new_tokens) take the
        native argmax straight from the model-dtype logits, under their grammar mask if they have
        one; only the others get a float32 copy of their rows. `grammar_rows` (host) index into
        `reqs`; the mask may be on the host. NOTE: on a GPU the whole step's results come back
        in one host synchronisation, at the end.
        """
        b = len(reqs)
        plain = [
            i
            for i, r in enumerate(reqs)
            if r.plain_greedy and len(r.output_ids) >= r.sampling_params.min_new_tokens
        ]
        mask_row: dict[int, int] = {}
        if grammar_mask is not None and grammar_rows is not None:
            mask_row = {int(g): j for j, g in enumerate(grammar_rows.tolist())}
        free = [i for i in plain if i not in mask_row]
        masked = [i for i in plain if i in mask_row]
        greedy_parts: list[tuple[list[int], torch.Tensor]] = []
        if free:
            greedy_parts.append((free, logits.greedy_ids([rows[i] for i in free])))
        if masked:
            assert grammar_mask is not None
            sub_mask = grammar_mask[[mask_row[i] for i in masked]]
            greedy_parts.append((masked, logits.greedy_ids([rows[i] for i in masked], sub_mask)))
        plain_set = set(plain)
        rest = [i for i in range(b) if i not in plain_set]
        dense_out = None
        if rest:
            sub_rows = None
            rest_mask = None
            if mask_row:
                keep = [(j, mask_row[i]) for j, i in enumerate(rest) if i in mask_row]
                if keep:
                    assert grammar_mask is not None
                    sub_rows = torch.tensor([j for j, _ in keep], dtype=torch.long)
                    rest_mask = grammar_mask[[m for _, m in keep]]
            dense = logits.rows_float([rows[i] for i in rest])
            dense_out = self._sample_dense(dense, [reqs[i] for i in rest], rest_mask, sub_rows)
        return PendingSample(b, greedy_parts, rest, dense_out)

    def _sample_dense(
        self,
        logits: torch.Tensor,
        reqs: list[Req],
        grammar_mask: torch.Tensor | None,
        grammar_rows: torch.Tensor | None,
    ) -> _DenseSample:
        """logits: [B, V] float32, one row per request in `reqs` (modified in place)."""
        logits = logits[:, : self.vocab_size]
        dev = logits.device
        lp_rows = [i for i, r in enumerate(reqs) if r.return_logprob]
        raw_logprobs = None
        if lp_rows:
            raw_logprobs = torch.log_softmax(logits[to_device(lp_rows, torch.long, dev)], dim=-1)

        self._apply_bias_and_min_tokens(logits, reqs)
        if any(
            r.sampling_params.frequency_penalty
            or r.sampling_params.presence_penalty
            or r.sampling_params.repetition_penalty != 1.0
            for r in reqs
        ):
            self._apply_penalties(logits, reqs)
        if grammar_mask is not None:
            apply_token_bitmask(logits, upload(grammar_mask, dev), grammar_rows)

        next_ids = logits.argmax(dim=-1)
        sampled = [i for i, r in enumerate(reqs) if not r.sampling_params.is_greedy]
        if sampled:
            sub = [reqs[i] for i in sampled]
            if len(sampled) == len(reqs):
                next_ids = self._sample_rows(logits, sub)
            else:
                index = to_device(sampled, torch.long, dev)
                next_ids[index] = self._sample_rows(logits[index], sub)

        top_nums = [reqs[i].top_logprobs_num for i in lp_rows]
        out = _DenseSample(next_ids, lp_rows, None, None, None, top_nums)
        if raw_logprobs is not None:
            index = to_device(lp_rows, torch.long, dev)
            out.chosen = raw_logprobs.gather(1, next_ids[index].unsqueeze(1)).squeeze(1)
            k_max = max(top_nums)
            if k_max > 0:  # each row keeps its own request's count (trimmed on the host)
                out.top_vals, out.top_ids = raw_logprobs.topk(k_max, dim=-1)
        return out

    def _apply_bias_and_min_tokens(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        """Logit biases and the stop tokens banned before min_new_tokens, for the whole batch in
        one op each (the per-request loop only gathers host lists)."""
        bias_rows: list[int] = []
        bias_ids: list[int] = []
        bias_vals: list[float] = []
        ban_rows: list[int] = []
        ban_ids: list[int] = []
        for i, r in enumerate(reqs):
            sp = r.sampling_params
            if sp.logit_bias:
                bias_rows.extend([i] * len(sp.logit_bias))
                bias_ids.extend(int(t) for t in sp.logit_bias)
                bias_vals.extend(sp.logit_bias.values())
            # with a grammar, the grammar decides when the output may end
            if sp.min_new_tokens and len(r.output_ids) < sp.min_new_tokens and r.grammar is None:
                banned = set(sp.stop_token_ids)
                if not sp.ignore_eos:
                    banned.update(self.eos_token_ids)
                ban_rows.extend([i] * len(banned))
                ban_ids.extend(banned)
        dev = logits.device
        if bias_rows:
            index = (to_device(bias_rows, torch.long, dev), to_device(bias_ids, torch.long, dev))
            logits.index_put_(index, to_device(bias_vals, logits.dtype, dev), accumulate=True)
        if ban_rows:
            index = (to_device(ban_rows, torch.long, dev), to_device(ban_ids, torch.long, dev))
            logits[index] = float("-inf")  # NOTE: a scalar: no host-to-device copy

    def _apply_penalties(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        b, v = logits.shape
        dev, dtype = logits.device, logits.dtype
        rows: list[int] = []
        flat: list[int] = []
        for i, r in enumerate(reqs):
            rows.extend([i] * len(r.output_ids))
            flat.extend(r.output_ids)
        counts = torch.zeros(b * v, dtype=dtype, device=dev)
        if flat:
            index = to_device(rows, torch.long, dev) * v + to_device(flat, torch.long, dev)
            counts.index_add_(0, index, torch.ones(len(flat), dtype=dtype, device=dev))
        counts = counts.view(b, v)
        seen = None
        reps = [r.sampling_params.repetition_penalty for r in reqs]
        if any(x != 1.0 for x in reps):
            seen = counts > 0
            prompt_rows: list[int] = []
            prompt_ids: list[int] = []
            for i, r in enumerate(reqs):
                if r.sampling_params.repetition_penalty != 1.0:
                    prompt_rows.extend([i] * len(r.origin_input_ids))
                    prompt_ids.extend(r.origin_input_ids)
            if prompt_ids:
                prompt_index = (
                    to_device(prompt_rows, torch.long, dev),
                    to_device(prompt_ids, torch.long, dev),
                )
                seen[prompt_index] = True
        freq = to_device([r.sampling_params.frequency_penalty for r in reqs], dtype, dev)
        pres = to_device([r.sampling_params.presence_penalty for r in reqs], dtype, dev)
        apply_penalties(logits, counts, seen, freq, pres, to_device(reps, dtype, dev))

    def _sample_rows(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        params = [r.sampling_params for r in reqs]
        dev, dtype = logits.device, logits.dtype
        temps = to_device([p.temperature for p in params], dtype, dev)
        probs = torch.softmax(logits / temps[:, None], dim=-1)
        top_k = top_p = min_p = None
        if any(p.top_k < TOP_K_DISABLED for p in params):
            top_k = to_device([min(p.top_k, self.vocab_size) for p in params], torch.long, dev)
        if any(p.top_p < 1.0 for p in params):
            top_p = to_device([p.top_p for p in params], dtype, dev)
        if any(p.min_p > 0.0 for p in params):
            min_p = to_device([p.min_p for p in params], dtype, dev)
        uniforms = to_device([r.uniform() for r in reqs], dtype, dev)
        return sample_from_probs(probs, uniforms, top_k, top_p, min_p)
