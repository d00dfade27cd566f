"""Pure-torch attention over the paged KV pool (CPU path, and the oracle for every other backend).

Decode rows (one new token) run batched: their KV slots are gathered into a padded tensor and
attended in one masked matmul pair, or by the native CPU kernel when it is available. Extend rows
(a prompt chunk on top of a cached prefix) run one request at a time through SDPA with a
bottom-right causal mask: prefill is compute-bound, so the loop costs little.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from radixgen.kernels.attention.base import AttentionBackend, AttentionLayerInfo


@dataclass
class TorchAttentionMetadata:
    # decode rows: positions in the flat token array, and their KV slots (CSR over the pool)
    decode_token_idx: torch.Tensor | None
    decode_kv_indices: torch.Tensor | None  # [sum(seq_len)] slots of all decode rows
    decode_kv_indptr: torch.Tensor | None  # [num_decode + 1]
    decode_padded_idx: torch.Tensor | None  # [num_decode, max_len] (torch fallback)
    decode_mask: torch.Tensor | None  # [num_decode, max_len] True where a key exists
    # extend rows: (token start, extend_len, prefix_len, kv slots of the whole sequence)
    extend_rows: list[tuple[int, int, int, torch.Tensor]]


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, kv_pool: Any, req_to_token_pool: Any, use_native: bool = True) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token_pool.req_to_token
        self.native = None
        if use_native:
            from radixgen.kernels.cpu import load_native_kernels

            self.native = load_native_kernels()
        self.meta: TorchAttentionMetadata | None = None

    def init_forward_metadata(self, batch: Any) -> None:
        extend_lens: list[int] = batch.extend_lens
        prefix_lens: list[int] = batch.prefix_lens
        req_rows = batch.req_pool_indices_cpu
        decode_rows = [i for i, e in enumerate(extend_lens) if e == 1]
        extend_rows: list[tuple[int, int, int, torch.Tensor]] = []
        starts = batch.extend_start_loc
        for i, e in enumerate(extend_lens):
            if e != 1:
                seq_len = prefix_lens[i] + e
                extend_rows.append(
                    (starts[i], e, prefix_lens[i], self.req_to_token[req_rows[i], :seq_len])
                )
        meta = TorchAttentionMetadata(None, None, None, None, None, extend_rows)
        if decode_rows:
            seq_lens = [prefix_lens[i] + 1 for i in decode_rows]
            rows = [req_rows[i] for i in decode_rows]
            meta.decode_token_idx = torch.tensor([starts[i] for i in decode_rows], dtype=torch.long)
            if self.native is not None:
                meta.decode_kv_indices = torch.cat(
                    [self.req_to_token[r, :n] for r, n in zip(rows, seq_lens, strict=True)]
                )
                indptr = [0]
                for n in seq_lens:
                    indptr.append(indptr[-1] + n)
                meta.decode_kv_indptr = torch.tensor(indptr, dtype=torch.long)
            else:
                max_len = max(seq_lens)
                lens = torch.tensor(seq_lens)
                meta.decode_mask = torch.arange(max_len)[None, :] < lens[:, None]
                padded = self.req_to_token[torch.tensor(rows), :max_len]
                meta.decode_padded_idx = padded.masked_fill(~meta.decode_mask, 0)
        self.meta = meta

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayerInfo,
        batch: Any,
    ) -> torch.Tensor:
        meta = self.meta
        assert meta is not None
        n = q.shape[0]
        h, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        k_buf, v_buf = self.kv_pool.get_kv_buffer(layer.layer_id)
        k = k.view(n, hkv, d)
        v = v.view(n, hkv, d)
        self.kv_pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v)
        q = q.view(n, h, d)
        if meta.decode_token_idx is not None and len(meta.extend_rows) == 0:
            return self._decode(q, k_buf, v_buf, layer, meta).view(n, h * d)
        out = torch.empty_like(q)
        if meta.decode_token_idx is not None:
            out[meta.decode_token_idx] = self._decode(
                q[meta.decode_token_idx], k_buf, v_buf, layer, meta
            )
        for start, ext, prefix, slots in meta.extend_rows:
            out[start : start + ext] = _extend_one(
                q[start : start + ext], k_buf[slots], v_buf[slots], prefix, layer
            )
        return out.view(n, h * d)

    def _decode(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        layer: AttentionLayerInfo,
        meta: TorchAttentionMetadata,
    ) -> torch.Tensor:
        if self.native is not None:
            out = torch.empty_like(q)
            self.native.decode_attention(
                q, k_buf, v_buf, meta.decode_kv_indices, meta.decode_kv_indptr, out, layer.scaling
            )
            return out
        return decode_attention_reference(
            q, k_buf, v_buf, meta.decode_padded_idx, meta.decode_mask, layer
        )


def decode_attention_reference(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    padded_idx: torch.Tensor,
    mask: torch.Tensor,
    layer: AttentionLayerInfo,
) -> torch.Tensor:
    """q: [B, H, D]; padded_idx/mask: [B, L] -> [B, H, D]. Scores and softmax in float32."""
    b = q.shape[0]
    h, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    keys = k_buf[padded_idx].float()  # [B, L, Hkv, D]
    values = v_buf[padded_idx].float()
    qg = q.float().view(b, hkv, h // hkv, d)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, keys) * layer.scaling
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
) -> torch.Tensor:
    """q: [E, H, D]; keys/values: [prefix + E, Hkv, D] -> [E, H, D], causal from the bottom right."""
    ext = q.shape[0]
    total = keys.shape[0]
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, E, D]
    kh = keys.transpose(0, 1).unsqueeze(0)
    vh = values.transpose(0, 1).unsqueeze(0)
    gqa = layer.num_heads != layer.num_kv_heads
    if prefix_len == 0:
        out = F.scaled_dot_product_attention(
            qh, kh, vh, is_causal=True, scale=layer.scaling, enable_gqa=gqa
        )
    else:
        q_pos = torch.arange(prefix_len, total).unsqueeze(1)
        mask = torch.arange(total).unsqueeze(0) <= q_pos  # [E, total]
        out = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=mask, scale=layer.scaling, enable_gqa=gqa
        )
    return out.squeeze(0).transpose(0, 1).reshape(ext, layer.num_heads, layer.head_dim)
