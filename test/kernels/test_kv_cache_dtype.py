"""Quantized KV pools (--kv-cache-dtype int8 / fp8_e4m3, and bf16 under a float32 model): the
native kernels read and write them as the pure-torch oracle does.

The oracle: `TokenToKVPool.set_kv` quantizes in torch, and the torch attention backend
dequantizes the rows it gathers, then attends. The native ragged kernel reads the same pool in
place; rope_store_kv quantizes on store.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from radixgen.kernels.attention.base import AttentionLayerInfo
from radixgen.kernels.attention.torch_backend import TorchAttentionBackend
from radixgen.kernels.cpu import load_native_kernels
from radixgen.kernels.kv_quant import (
    KVCacheFormat,
    dequantize_kv,
    quantize_kv,
    resolve_kv_cache_format,
)
from radixgen.runtime.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool

native = load_native_kernels()
pytestmark = pytest.mark.skipif(native is None, reason="no C compiler for the native kernels")

# (kv cache dtype, model dtype): the quantized formats, and bf16 storage under a float32 model
FORMATS = [
    ("int8", torch.bfloat16),
    ("fp8_e4m3", torch.bfloat16),
    ("int8", torch.float32),
    ("fp8_e4m3", torch.float32),
    ("bf16", torch.float32),
]
# (prefix, extend): decode rows and extend chunks, some past the kernel's 256-key block
DECODE = [(40, 1), (300, 1), (0, 1), (17, 1)]
EXTEND = [(0, 37), (5, 300), (40, 3), (0, 1), (260, 2)]


@dataclass
class Batch:
    out_cache_loc: torch.Tensor
    req_pool_indices_cpu: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    extend_start_loc: list[int]


def _pool(kv: str, dtype: torch.dtype, page: int, layers: int = 1, hkv: int = 3, d: int = 64):
    fmt = resolve_kv_cache_format(kv, dtype)
    return TokenToKVPool(4096, page, layers, hkv, d, dtype, "cpu", fmt)


def _fill(pool: TokenToKVPool, reqs: list[tuple[int, int]], hkv: int, d: int):
    """Slots for each request's prefix + extend, random K/V (with outlier channels) written to
    its prefix through the torch store; returns (req_to_token pool, batch, new-token K/V)."""
    r2t = ReqToTokenPool(len(reqs) + 1, 1024)
    slots, new_k, new_v, starts = [], [], [], []
    for r, (prefix, ext) in enumerate(reqs):
        s = pool.alloc_extend([0], [prefix + ext], [-1])
        assert s is not None
        r2t.write_row(r, 0, s)
        k = torch.randn(prefix + ext, hkv, d) * torch.linspace(0.02, 4.0, d)
        v = torch.randn(prefix + ext, hkv, d) * 0.05
        pool.set_kv(0, s[:prefix], k[:prefix], v[:prefix])
        slots.append(s[prefix:])
        new_k.append(k[prefix:])
        new_v.append(v[prefix:])
        starts.append(sum(e for _, e in reqs[:r]))
    batch = Batch(
        torch.cat(slots), list(range(len(reqs))), [p for p, _ in reqs], [e for _, e in reqs], starts
    )
    return r2t, batch, torch.cat(new_k), torch.cat(new_v)


@pytest.mark.parametrize(("kv", "dtype"), FORMATS)
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("reqs", [DECODE, EXTEND], ids=["decode", "extend"])
def test_native_attention_matches_the_torch_oracle(native, kv, dtype, page, reqs):
    torch.manual_seed(0)
    h, hkv, d = 9, 3, 64
    pool = _pool(kv, dtype, page)
    assert pool.k_buffer.dtype == resolve_kv_cache_format(kv, dtype).storage
    r2t, batch, k_new, v_new = _fill(pool, reqs, hkv, d)
    n = int(batch.out_cache_loc.numel())
    q = torch.randn(n, h * d).to(dtype)
    layer = AttentionLayerInfo(0, h, hkv, d, d**-0.5)
    outs = []
    for kernels in (native, None):
        backend = TorchAttentionBackend(pool, r2t, kernels)
        backend.init_forward_metadata(batch)
        outs.append(
            backend.forward(q, k_new.reshape(n, -1).to(dtype), v_new.reshape(n, -1).to(dtype),
                            layer, batch).float()
        )  # fmt: skip
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(outs[0], outs[1], rtol=tol, atol=tol * 0.05)


@pytest.mark.parametrize(("kv", "dtype"), FORMATS)
def test_rope_store_kv_quantizes_as_the_torch_store(native, kv, dtype):
    """The fused store writes what `set_kv` would write for the values an auto pool holds."""
    torch.manual_seed(1)
    n, h, hkv, d = 37, 9, 3, 64
    qkv = torch.randn(n, (h + 2 * hkv) * d) * 2  # float32: an unrounded projection
    pos = torch.randint(0, 500, (n,))
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(512).float(), inv)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    loc = torch.randperm(200)[:n] + 1
    plain = _pool("auto", dtype, 1)
    q_ref = native.rope_store_kv(qkv, pos, cos, sin, *plain.get_kv_buffer(0), loc, h, hkv, d)
    quant = _pool(kv, dtype, 1)
    q = native.rope_store_kv(
        qkv, pos, cos, sin, *quant.get_kv_buffer(0), loc, h, hkv, d, dtype, quant.get_kv_scales(0)
    )
    assert q.dtype == dtype and torch.equal(q, q_ref)
    oracle = _pool(kv, dtype, 1)
    oracle.set_kv(0, loc, plain.k_buffer[0, loc], plain.v_buffer[0, loc])
    for name in ("k_buffer", "v_buffer", "k_scale", "v_scale"):
        got, want = getattr(quant, name), getattr(oracle, name)
        if want is None:
            assert got is None
            continue
        got, want = got[0, loc], want[0, loc]
        if got.dtype == torch.float8_e4m3fn:
            got, want = got.view(torch.uint8), want.view(torch.uint8)
        assert torch.equal(got, want), name


def test_fp8_codes_decode_exactly(native):
    """Every finite e4m3 code, read by the kernel (one key per query: out = its value row),
    equals torch's float8_e4m3fn conversion; encoding torch's values gives the codes back."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    d = 64
    rows = -(-codes.numel() // d)
    flat = torch.cat([codes, torch.zeros(rows * d - codes.numel(), dtype=torch.uint8)])
    v = torch.zeros(rows + 1, 1, d, dtype=torch.uint8)
    v[1:, 0] = flat.view(rows, d)
    v = v.view(torch.float8_e4m3fn)
    k = torch.zeros_like(v)
    q = torch.randn(rows, 1, d)
    out = torch.empty(rows, 1, d)
    idx = torch.arange(1, rows + 1)
    ind = torch.arange(rows + 1)
    native.ragged_attention(q, k, v, idx, ind, ind, torch.zeros(rows, dtype=torch.long), out, 1.0)
    assert torch.equal(out.view(-1)[: codes.numel()], codes.view(torch.float8_e4m3fn).float())
    fmt = KVCacheFormat("fp8_e4m3", torch.float8_e4m3fn, scaled=False)  # per-tensor scale 1
    values = codes.view(torch.float8_e4m3fn).float().view(-1, 1, 1)
    data, scale = quantize_kv(values, fmt, torch.float32)
    assert torch.equal(dequantize_kv(data, scale).view(-1), values.view(-1))


@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3"])
def test_each_row_has_its_own_scale(kv):
    """Per token and head: a row of large values does not coarsen a row of small ones."""
    fmt = resolve_kv_cache_format(kv, torch.float32)
    x = torch.tensor([[[1.0, -0.5, 0.25, 0.0], [100.0, 50.0, -25.0, 1.0]], [[0.0] * 4] * 2])
    data, scale = quantize_kv(x, fmt, torch.float32)
    top = 127.0 if kv == "int8" else 448.0
    assert scale is not None and scale.shape == (2, 2)
    torch.testing.assert_close(scale[0], torch.tensor([1.0, 100.0]) / top)
    back = dequantize_kv(data, scale)
    rel = 0.5001 / 127 if kv == "int8" else 2**-4  # half a step: of absmax / 127, of e4m3
    assert ((back - x).abs() <= x.abs().amax(-1, keepdim=True) * rel + 1e-12).all()
    assert torch.equal(back[1], torch.zeros(2, 4))


@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize(("h", "hkv", "d"), [(16, 2, 128), (6, 2, 32), (4, 4, 48), (8, 1, 40)])
def test_other_head_shapes_match_the_oracle(native, kv, h, hkv, d):
    """Shapes outside the kernel's compiled-in ones: the generic AVX-512 body (D % 16 == 0) and
    the portable loop (D = 40)."""
    torch.manual_seed(2)
    pool = _pool(kv, torch.bfloat16, 1, hkv=hkv, d=d)
    r2t, batch, k_new, v_new = _fill(pool, [(300, 1), (20, 5)], hkv, d)
    n = int(batch.out_cache_loc.numel())
    q = torch.randn(n, h * d).bfloat16()
    layer = AttentionLayerInfo(0, h, hkv, d, d**-0.5)
    outs = []
    for kernels in (native, None):
        backend = TorchAttentionBackend(pool, r2t, kernels)
        backend.init_forward_metadata(batch)
        k, v = k_new.reshape(n, -1).bfloat16(), v_new.reshape(n, -1).bfloat16()
        outs.append(backend.forward(q, k, v, layer, batch).float())
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3", "bf16"])
def test_gpu_backends_refuse_converted_kv(backend, kv):
    """They read K/V in the model dtype only: refused by name before their package is loaded."""
    from radixgen.errors import InvalidRequestError
    from radixgen.kernels.attention import create_attention_backend

    pool = _pool(kv, torch.float32, 1)
    with pytest.raises(InvalidRequestError, match=f"the {backend} attention backend reads"):
        create_attention_backend(backend, pool, ReqToTokenPool(2, 16))
