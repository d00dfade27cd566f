"""Pure-torch attention over the paged KV pool (CPU path, and the oracle for every other backend).

With the native CPU kernel (the default), every row of the batch, decode or prefill chunk, goes
through one ragged call that computes each row the same way whatever the batch, chunking or
cache state (so seeded sampling is reproducible). Without it (no C compiler, or as the test
oracle): decode rows are gathered into a padded tensor and attended in one masked matmul pair;
extend rows (a chunk on top of a cached prefix) run one request at a time through SDPA with a
bottom-right causal mask.

A quantized pool (int8 with per-token, per-head scales, or fp8_e4m3) is read in place by the
native kernel; the torch path dequantizes the rows it gathers (never the whole pool).

A layer whose info carries `sliding_window` W (Mistral, some Qwen2 layers) lets a query at
position p see only keys at p - W < k <= p: decode rows then read only their last W slots, extend
rows get a banded mask. The per-window decode layout is built once per step and shared by layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..device_io import upload
from ..kv_quant import dequantize_kv
from .base import (
    AttentionBackend,
    AttentionBatch,
    AttentionLayerInfo,
    KVPool,
    ReqToTokenPool,
    is_quantized_kv,
    kv_scales,
)

if TYPE_CHECKING:
    from ..cpu import NativeKernels


@dataclass
class TorchAttentionMetadata:
    # decode rows (torch path): positions in the flat token array, their padded KV slots
    decode_token_idx: torch.Tensor | None
    decode_padded_idx: torch.Tensor | None  # [num_decode, max_len]
    decode_mask: torch.Tensor | None  # [num_decode, max_len] True where a key exists
    # extend rows: (token start, extend_len, prefix_len, kv slots of the whole sequence)
    extend_rows: list[tuple[int, int, int, torch.Tensor]]
    # decode rows' (request slot, sequence length), and their layout per sliding window
    decode_rows: list[tuple[int, int]] = field(default_factory=list)
    windowed: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # native path: every row of the batch in one ragged call
    ragged: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class TorchAttentionBackend(AttentionBackend):
    """native: the CPU kernels the model runner chose, or None for the pure-torch path."""

    def __init__(
        self,
        kv_pool: KVPool,
        req_to_token_pool: ReqToTokenPool,
        native: NativeKernels | None = None,
    ) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token_pool.device_req_to_token
        self.native = native
        self.meta: TorchAttentionMetadata | None = None

    def init_forward_metadata(self, batch: AttentionBatch) -> None:
        extend_lens = batch.extend_lens
        prefix_lens = batch.prefix_lens
        req_rows = batch.req_pool_indices_cpu
        if self.native is not None:
            self.meta = self._ragged_metadata(req_rows, prefix_lens, extend_lens)
            return
        decode_rows = [i for i, e in enumerate(extend_lens) if e == 1]
        extend_rows: list[tuple[int, int, int, torch.Tensor]] = []
        starts = batch.extend_start_loc
        for i, e in enumerate(extend_lens):
            if e != 1:
                seq_len = prefix_lens[i] + e
                extend_rows.append(
                    (starts[i], e, prefix_lens[i], self.req_to_token[req_rows[i], :seq_len])
                )
        meta = TorchAttentionMetadata(None, None, None, extend_rows)
        if decode_rows:
            seq_lens = [prefix_lens[i] + 1 for i in decode_rows]
            rows = [req_rows[i] for i in decode_rows]
            meta.decode_token_idx = upload(
                torch.tensor([starts[i] for i in decode_rows], dtype=torch.long),
                self.req_to_token.device,
            )
            meta.decode_rows = list(zip(rows, seq_lens, strict=True))
            meta.decode_padded_idx, meta.decode_mask = self._decode_layout(meta.decode_rows, None)
        self.meta = meta

    def native_ragged_layout(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        return self.meta.ragged if self.meta is not None and self.native is not None else None

    def _ragged_metadata(
        self, req_rows: list[int], prefix_lens: list[int], extend_lens: list[int]
    ) -> TorchAttentionMetadata:
        """CSR of every request's keys and query rows for the native ragged kernel."""
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
        kv_indices = torch.cat(
            [self.req_to_token[r, :n] for r, n in zip(req_rows, seq_lens, strict=True)]
        )
        kv_indptr = [0]
        q_indptr = [0]
        for n, e in zip(seq_lens, extend_lens, strict=True):
            kv_indptr.append(kv_indptr[-1] + n)
            q_indptr.append(q_indptr[-1] + e)
        ragged = (
            kv_indices,
            torch.tensor(kv_indptr, dtype=torch.long),
            torch.tensor(q_indptr, dtype=torch.long),
            torch.tensor(prefix_lens, dtype=torch.long),
        )
        return TorchAttentionMetadata(None, None, None, [], ragged=ragged)

    def _decode_layout(
        self, rows: list[tuple[int, int]], window: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(padded slots, mask) of the decode rows for the torch path.

        With a window, each row keeps only the slots of its last `window` positions.
        """
        spans = [(r, 0 if window is None else max(0, n - window), n) for r, n in rows]
        max_len = max(hi for _, _, hi in spans)
        dev = self.req_to_token.device  # NOTE: the table's device: masks must live beside it
        pos = torch.arange(max_len, device=dev)[None, :]
        bounds = upload(torch.tensor([[lo for _, lo, _ in spans], [hi for _, _, hi in spans]]), dev)
        mask = (pos >= bounds[0][:, None]) & (pos < bounds[1][:, None])
        row_index = upload(torch.tensor([r for r, _, _ in spans]), dev)
        padded = self.req_to_token[row_index, :max_len]
        return padded.masked_fill(~mask, 0), mask

    def _decode_meta(
        self, meta: TorchAttentionMetadata, window: int | None
    ) -> TorchAttentionMetadata:
        """The step's metadata with the decode layout for `window` (cached per window)."""
        if window is None or all(n <= window for _, n in meta.decode_rows):
            return meta
        if window not in meta.windowed:
            meta.windowed[window] = self._decode_layout(meta.decode_rows, window)
        padded, mask = meta.windowed[window]
        return TorchAttentionMetadata(
            meta.decode_token_idx, padded, mask, meta.extend_rows, meta.decode_rows
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayerInfo,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        meta = self.meta
        assert meta is not None
        n = q.shape[0]
        h, d = layer.num_heads, layer.head_dim
        k_buf, v_buf = self.kv_pool.get_kv_buffer(layer.layer_id)
        scales = kv_scales(self.kv_pool, layer.layer_id)
        self.store_new_kv(k, v, layer, batch)
        q = q.view(n, h, d)
        window = layer.sliding_window
        if meta.ragged is not None and self.native is not None:
            assert layer.logit_softcap is None, "the native kernel has no logit soft-capping"
            out = torch.empty((n, h, d), dtype=q.dtype)
            self.native.ragged_attention(
                q, k_buf, v_buf, *meta.ragged, out, layer.scaling, window, scales
            )
            return out.view(n, h * d)
        pool = KVRows(k_buf, v_buf, scales)
        if meta.decode_token_idx is not None:
            meta = self._decode_meta(meta, window)
        if meta.decode_token_idx is not None and len(meta.extend_rows) == 0:
            return self._decode(q, pool, layer, meta).view(n, h * d)
        out = torch.empty_like(q)
        if meta.decode_token_idx is not None:
            out[meta.decode_token_idx] = self._decode(q[meta.decode_token_idx], pool, layer, meta)
        for start, ext, prefix, slots in meta.extend_rows:
            keys, values = pool.gather(slots, q.dtype)
            out[start : start + ext] = _extend_one(
                q[start : start + ext], keys, values, prefix, layer, window
            )
        return out.view(n, h * d)

    def _decode(
        self,
        q: torch.Tensor,
        pool: KVRows,
        layer: AttentionLayerInfo,
        meta: TorchAttentionMetadata,
    ) -> torch.Tensor:
        assert meta.decode_padded_idx is not None and meta.decode_mask is not None
        return decode_attention_reference(
            q, pool.k, pool.v, meta.decode_padded_idx, meta.decode_mask, layer, pool.scales
        )


@dataclass(frozen=True)
class KVRows:
    """One layer's K/V buffers (and int8 scales), read a gathered set of rows at a time."""

    k: torch.Tensor
    v: torch.Tensor
    scales: tuple[torch.Tensor, torch.Tensor] | None = None

    def gather(self, idx: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at pool slots `idx` (any shape), dequantized to `dtype` when stored
        quantized (or in another dtype)."""
        keys, values = self.k[idx], self.v[idx]
        if self.scales is None and not is_quantized_kv(keys):
            return keys.to(dtype), values.to(dtype)
        ks, vs = (None, None) if self.scales is None else (s[idx] for s in self.scales)
        return dequantize_kv(keys, ks, dtype), dequantize_kv(values, vs, dtype)


def decode_attention_reference(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    padded_idx: torch.Tensor,
    mask: torch.Tensor,
    layer: AttentionLayerInfo,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """q: [B, H, D]; padded_idx/mask: [B, L] -> [B, H, D]. Scores and softmax in float32.
    scales: the int8 pool's K and V scales (None: unscaled storage)."""
    b = q.shape[0]
    h, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    keys, values = KVRows(k_buf, v_buf, scales).gather(padded_idx, torch.float32)
    qg = q.float().view(b, hkv, h // hkv, d)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, keys) * layer.scaling
    if layer.logit_softcap is not None:
        scores = torch.tanh(scores / layer.logit_softcap) * layer.logit_softcap
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    probs = scores.softmax(dim=-1)
    out = torch.einsum("bkgl,blkd->bkgd", probs, values)
    return out.reshape(b, h, d).to(q.dtype)


def _extend_one(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    prefix_len: int,
    layer: AttentionLayerInfo,
    window: int | None = None,
) -> torch.Tensor:
    """q: [E, H, D]; keys/values: [prefix + E, Hkv, D] -> [E, H, D], causal from the bottom right.

    With a `window`, a query at position p sees keys p - window < k <= p only.
    """
    ext = q.shape[0]
    total = keys.shape[0]
    if window is not None and total <= window:
        window = None  # every key is inside the window
    if window is not None:  # drop keys no query can see: the first query sits at prefix_len
        first = max(0, prefix_len - window + 1)
        keys, values, prefix_len, total = (
            keys[first:],
            values[first:],
            prefix_len - first,
            total - first,
        )
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, E, D]
    kh = keys.transpose(0, 1).unsqueeze(0)
    vh = values.transpose(0, 1).unsqueeze(0)
    gqa = layer.num_heads != layer.num_kv_heads
    if layer.logit_softcap is not None:  # SDPA cannot cap the scores: the same, written out
        mask = _band_mask(prefix_len, total, window, q.device)
        return _softcapped(q, keys, values, mask, layer)
    if prefix_len == 0 and window is None:
        out = F.scaled_dot_product_attention(
            qh, kh, vh, is_causal=True, scale=layer.scaling, enable_gqa=gqa
        )
    else:
        mask = _band_mask(prefix_len, total, window, q.device)
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, scale=layer.scaling, enable_gqa=gqa
        )
    return out.squeeze(0).transpose(0, 1).reshape(ext, layer.num_heads, layer.head_dim)


def _band_mask(
    prefix_len: int, total: int, window: int | None, device: torch.device
) -> torch.Tensor:
    """[E, total] True where the query at prefix_len + i may see key j (causal, windowed)."""
    q_pos = torch.arange(prefix_len, total, device=device).unsqueeze(1)
    k_pos = torch.arange(total, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


def _softcapped(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    layer: AttentionLayerInfo,
) -> torch.Tensor:
    """Masked attention with capped scores, float32: q [E, H, D], keys/values [T, Hkv, D]."""
    assert layer.logit_softcap is not None
    ext, h, d = q.shape
    hkv = layer.num_kv_heads
    qg = q.float().view(ext, hkv, h // hkv, d)
    scores = torch.einsum("ekgd,tkd->kget", qg, keys.float()) * layer.scaling
    scores = torch.tanh(scores / layer.logit_softcap) * layer.logit_softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.einsum("kget,tkd->ekgd", scores.softmax(dim=-1), values.float())
    return out.reshape(ext, h, d).to(q.dtype)
