"""The attention backends by name: `create_attention_backend(name)` builds one.

This module, not `base.py`, knows the backends, so the contract imports none of them. The backend
modules import no GPU library at load time (triton and flashinfer load when a backend is built),
so importing them here keeps the CPU path free of both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import AttentionBackend, AttentionLayerInfo, KVPool, ReqToTokenPool, refuse_converted_kv
from .flashinfer_backend import FlashInferAttentionBackend
from .torch_backend import TorchAttentionBackend
from .triton_backend import TritonAttentionBackend

if TYPE_CHECKING:
    from ..cpu import NativeKernels

BackendFactory = Callable[
    [KVPool, ReqToTokenPool, "NativeKernels | None", "AttentionLayerInfo | None"], AttentionBackend
]


def _torch(
    kv_pool: KVPool,
    req_to_token_pool: ReqToTokenPool,
    native: NativeKernels | None,
    layer_info: AttentionLayerInfo | None,
) -> AttentionBackend:
    return TorchAttentionBackend(kv_pool, req_to_token_pool, native)


def _triton(
    kv_pool: KVPool,
    req_to_token_pool: ReqToTokenPool,
    native: NativeKernels | None,
    layer_info: AttentionLayerInfo | None,
) -> AttentionBackend:
    refuse_converted_kv(kv_pool, "triton")
    return TritonAttentionBackend(kv_pool, req_to_token_pool)


def _flashinfer(
    kv_pool: KVPool,
    req_to_token_pool: ReqToTokenPool,
    native: NativeKernels | None,
    layer_info: AttentionLayerInfo | None,
) -> AttentionBackend:
    refuse_converted_kv(kv_pool, "flashinfer")
    # NOTE: the pool's page size (TokenToKVPool.page_size); the KVPool protocol leaves it out
    page_size = int(getattr(kv_pool, "page_size", 1))
    return FlashInferAttentionBackend(kv_pool, req_to_token_pool, page_size, layer_info)


# name -> factory, in the order the CLI lists them
_BACKENDS: dict[str, BackendFactory] = {
    "torch": _torch,
    "triton": _triton,
    "flashinfer": _flashinfer,
}
ATTENTION_BACKENDS = tuple(_BACKENDS)


def create_attention_backend(
    name: str,
    kv_pool: KVPool,
    req_to_token_pool: ReqToTokenPool,
    native: NativeKernels | None = None,
    layer_info: AttentionLayerInfo | None = None,
) -> AttentionBackend:
    """native: the CPU kernels the model runner chose (None: the pure-torch path).
    layer_info: any layer's geometry (heads, scale): flashinfer plans its CUDA-graph decode with
    it before any layer runs (eager steps learn it from the first layer).
    """
    factory = _BACKENDS.get(name)
    if factory is None:
        raise ValueError(
            f"unknown attention backend {name!r} (one of {', '.join(ATTENTION_BACKENDS)})"
        )
    return factory(kv_pool, req_to_token_pool, native, layer_info)
