"""Independent GGUF block decoders and a tiny-model GGUF writer, for testing our converter.

The decoders follow ggml's block layouts (ggml-common.h / dequantize_row_* in ggml-quants.c)
written out plainly, so they share no code with the `gguf` package the converter uses. K-quant
blocks, which the `gguf` package cannot produce, are drawn at random here (any bytes are a valid
block once the fp16 scales are finite).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
BLOCK: dict[Q, tuple[int, int]] = {  # type -> (elements, bytes) per block
    Q.Q8_0: (32, 34),
    Q.Q4_0: (32, 18),
    Q.Q4_1: (32, 20),
    Q.Q4_K: (256, 144),
    Q.Q6_K: (256, 210),
}


def _f16(raw: np.ndarray) -> np.ndarray:
    """[nb, 2] uint8 -> [nb, 1] float32 from little-endian fp16."""
    return raw.copy().view(np.float16).astype(np.float32)


def ref_dequantize(data: np.ndarray, qtype: Q, n_cols: int) -> np.ndarray:
    """Bytes (or f32/f16 values) of a [rows, n_cols] tensor -> float32 [rows, n_cols]."""
    if qtype == Q.F32:
        return data.astype(np.float32).reshape(-1, n_cols)
    if qtype == Q.F16:
        return data.view(np.float16).astype(np.float32).reshape(-1, n_cols)
    if qtype == Q.BF16:
        halves = data.reshape(-1).view(np.uint16).astype(np.uint32) << 16
        return halves.view(np.float32).reshape(-1, n_cols)
    elems, size = BLOCK[qtype]
    b = data.reshape(-1, size)
    out = np.empty((b.shape[0], elems), dtype=np.float32)
    if qtype == Q.Q8_0:
        out[:] = _f16(b[:, 0:2]) * b[:, 2:].view(np.int8).astype(np.float32)
    elif qtype in (Q.Q4_0, Q.Q4_1):
        d = _f16(b[:, 0:2])
        qs = b[:, 4:] if qtype == Q.Q4_1 else b[:, 2:]
        lo, hi = (qs & 0xF).astype(np.float32), (qs >> 4).astype(np.float32)
        if qtype == Q.Q4_0:
            out[:, :16], out[:, 16:] = (lo - 8) * d, (hi - 8) * d
        else:
            m = _f16(b[:, 2:4])
            out[:, :16], out[:, 16:] = lo * d + m, hi * d + m
    elif qtype == Q.Q4_K:
        _q4_k(b, out)
    else:
        _q6_k(b, out)
    return out.reshape(-1, n_cols)


def _q4_k(b: np.ndarray, out: np.ndarray) -> None:
    """block_q4_K: d, dmin (fp16), scales[12] (6-bit scale/min pairs), qs[128] (4-bit)."""
    d, dmin, sc, qs = _f16(b[:, 0:2]), _f16(b[:, 2:4]), b[:, 4:16].astype(np.int32), b[:, 16:]

    def scale_min(j: int) -> tuple[np.ndarray, np.ndarray]:  # get_scale_min_k4
        if j < 4:
            return sc[:, j] & 63, sc[:, j + 4] & 63
        s = (sc[:, j + 4] & 0xF) | ((sc[:, j - 4] >> 6) << 4)
        m = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
        return s, m

    for chunk in range(4):  # 64 outputs per chunk: 32 low nibbles, then 32 high nibbles
        q = qs[:, 32 * chunk : 32 * chunk + 32]
        for half, nib in ((0, q & 0xF), (1, q >> 4)):
            s, m = scale_min(2 * chunk + half)
            d1 = d[:, 0] * s.astype(np.float32)
            m1 = dmin[:, 0] * m.astype(np.float32)
            col = 64 * chunk + 32 * half
            out[:, col : col + 32] = d1[:, None] * nib.astype(np.float32) - m1[:, None]


def _q6_k(b: np.ndarray, out: np.ndarray) -> None:
    """block_q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d (fp16)."""
    ql, qh = b[:, 0:128].astype(np.int32), b[:, 128:192].astype(np.int32)
    scales = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])[:, 0]
    for n in range(2):  # two halves of 128 outputs
        lq, hq, sc = ql[:, 64 * n : 64 * n + 64], qh[:, 32 * n : 32 * n + 32], scales[:, 8 * n :]
        for l in range(32):  # noqa: E741 - ggml's own loop variable
            i = l // 16
            q1 = ((lq[:, l] & 0xF) | ((hq[:, l] & 3) << 4)) - 32
            q2 = ((lq[:, l + 32] & 0xF) | (((hq[:, l] >> 2) & 3) << 4)) - 32
            q3 = ((lq[:, l] >> 4) | (((hq[:, l] >> 4) & 3) << 4)) - 32
            q4 = ((lq[:, l + 32] >> 4) | (((hq[:, l] >> 6) & 3) << 4)) - 32
            base = 128 * n + l
            for k, qv in enumerate((q1, q2, q3, q4)):
                out[:, base + 32 * k] = d * sc[:, i + 2 * k] * qv.astype(np.float32)


def random_k_blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random but valid K-quant bytes for a [rows, cols] tensor (small, finite scales)."""
    elems, size = BLOCK[qtype]
    nb = rows * cols // elems
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if qtype == Q.Q4_K:
        raw[:, 0:2] = rng.uniform(0.002, 0.004, (nb, 1)).astype(np.float16).view(np.uint8)
        raw[:, 2:4] = rng.uniform(0.002, 0.004, (nb, 1)).astype(np.float16).view(np.uint8)
    else:
        raw[:, 208:210] = rng.uniform(5e-5, 1e-4, (nb, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf `LlamaModel.permute` (half-split rope rows -> interleaved)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def ref_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of `llama_cpp_permute` by explicit row indices: orig[h*D + t*D/2 + j] = perm[h*D + 2j + t]."""
    dim = w.shape[0] // n_head
    src = np.empty(w.shape[0], dtype=np.int64)
    for h in range(n_head):
        for t in range(2):
            for j in range(dim // 2):
                src[h * dim + t * dim // 2 + j] = h * dim + 2 * j + t
    return w[src]


_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    """HF tensor name -> llama.cpp tensor name."""
    glob = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    base, _, kind = hf.rpartition(".")
    if base in glob:
        return f"{glob[base]}.{kind}"
    _, _, layer, rest = base.split(".", 3)
    return f"blk.{layer}.{_LAYER[rest]}.{kind}"


def write_tiny_gguf(
    path: Path,
    arch: str,
    config: object,
    state: dict[str, np.ndarray],
    qtype: Q,
    seed: int = 0,
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Write `state` (HF names, float32) as llama.cpp would; return what a correct converter
    must produce for each HF name (the reference decode of the written bytes, un-permuted).
    `extra_tensors` (GGUF names, float32) are written as they are, e.g. rope_freqs.weight."""
    cfg = config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads  # type: ignore[attr-defined]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)  # type: ignore[attr-defined]
    w.add_context_length(cfg.max_position_embeddings)  # type: ignore[attr-defined]
    w.add_embedding_length(cfg.hidden_size)  # type: ignore[attr-defined]
    w.add_feed_forward_length(cfg.intermediate_size)  # type: ignore[attr-defined]
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)  # type: ignore[attr-defined]
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])  # type: ignore[attr-defined]
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)  # type: ignore[attr-defined]
    rng = np.random.default_rng(seed)
    expected: dict[str, np.ndarray] = {}
    for name, arr in state.items():
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        n_perm = heads if "q_proj" in name else kv_heads if "k_proj" in name else 0
        if arch in ("llama", "mistral") and n_perm:
            arr = llama_cpp_permute(arr, n_perm)
        if arr.ndim == 1:  # norms and biases stay f32, as llama.cpp keeps them
            w.add_tensor(gguf_name(name), arr)
            decoded = arr
        elif qtype in (Q.F32, Q.F16):
            stored = arr.astype(np.float16) if qtype == Q.F16 else arr
            w.add_tensor(gguf_name(name), stored)
            decoded = ref_dequantize(stored, qtype, arr.shape[1])
        else:
            if qtype in (Q.Q4_K, Q.Q6_K):
                raw = random_k_blocks(qtype, arr.shape[0], arr.shape[1], rng)
            else:
                raw = gguf.quants.quantize(arr, qtype)
            w.add_tensor(gguf_name(name), raw, raw_dtype=qtype)
            decoded = ref_dequantize(raw, qtype, arr.shape[1])
        if arch in ("llama", "mistral") and n_perm:
            decoded = ref_unpermute(decoded, n_perm)
        expected[name] = decoded
    for gguf_tensor, arr in (extra_tensors or {}).items():
        w.add_tensor(gguf_tensor, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected
