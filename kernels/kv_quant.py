"""KV cache storage dtypes (`--kv-cache-dtype`): what each stores per token, and the torch
quantize / dequantize the pool's writes and the torch attention oracle use (scheduler process).

- `auto`: the model dtype (today's behaviour); `bf16`: bfloat16 whatever the model dtype.
- `int8`: symmetric per-token, per-head int8, `scale = absmax / 127` in a float32 tensor
  [slots, kv heads] beside the data (x ~= q * scale).
- `fp8_e4m3`: `torch.float8_e4m3fn` with the same per-token, per-head float32 scale,
  `scale = absmax / 448` (x ~= e4m3(x / scale) * scale, round to nearest even). SGLang's default
  per-tensor scale of 1.0 costs no scale bytes but measured 7/12 greedy agreements with bf16 on
  the default model (values under 2^-6 fall into e4m3's subnormals): per-row scales keep every
  row in e4m3's normal range. The native kernels also read unscaled fp8 pools (scales NULL).

The native CPU kernels read and write the same layouts (kernels/cpu/kv_quant.h).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KV_CACHE_DTYPES = ("auto", "bf16", "fp8_e4m3", "int8")
FP8_E4M3_MAX = 448.0
INT8_MAX = 127.0


@dataclass(frozen=True)
class KVCacheFormat:
    """How the pool stores one token's K (or V) for one head: `storage` elements of `head_dim`,
    plus one float32 scale when `scaled`."""

    name: str  # the resolved flag value: "float32", "bf16", "float16", "fp8_e4m3", "int8"
    storage: torch.dtype
    scaled: bool

    @property
    def quantized(self) -> bool:
        return self.storage in (torch.int8, torch.float8_e4m3fn)

    def bytes_per_token(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        """Bytes of K and V (and their scales) for one token over every layer."""
        per_head = head_dim * self.storage.itemsize + (4 if self.scaled else 0)
        return 2 * num_layers * num_kv_heads * per_head


_MODEL_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bf16", torch.float16: "float16"}


def resolve_kv_cache_format(kv_cache_dtype: str, model_dtype: torch.dtype) -> KVCacheFormat:
    """The storage `--kv-cache-dtype` asks for under a model in `model_dtype`."""
    if kv_cache_dtype == "auto":
        return KVCacheFormat(_MODEL_DTYPE_NAMES[model_dtype], model_dtype, False)
    if kv_cache_dtype == "bf16":
        return KVCacheFormat("bf16", torch.bfloat16, False)
    if kv_cache_dtype == "fp8_e4m3":
        return KVCacheFormat("fp8_e4m3", torch.float8_e4m3fn, True)
    if kv_cache_dtype == "int8":
        return KVCacheFormat("int8", torch.int8, True)
    raise ValueError(f"unknown kv cache dtype {kv_cache_dtype!r} (one of {KV_CACHE_DTYPES})")


def quantize_kv(
    x: torch.Tensor, fmt: KVCacheFormat, model_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: [N, Hkv, D] -> (data in fmt.storage, float32 [N, Hkv] scales or None).

    NOTE: x is first rounded to the model dtype, so a quantized entry is the quantization of
    exactly what an `auto` pool would hold (the native store rounds the same way).
    """
    if not fmt.quantized:
        return x.to(fmt.storage), None
    x = x.to(model_dtype).float()
    if fmt.storage == torch.int8:
        scale = x.abs().amax(dim=-1) / INT8_MAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(x / safe[..., None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        return q, scale
    assert fmt.storage == torch.float8_e4m3fn
    if not fmt.scaled:
        return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn), None
    scale = x.abs().amax(dim=-1) / FP8_E4M3_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (x / safe[..., None]).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, safe


def dequantize_kv(
    data: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Stored rows [..., Hkv, D] (and their [..., Hkv] scales) -> values in `dtype`."""
    x = data.float()
    if scale is not None:
        x = x * scale[..., None]
    return x.to(dtype)
