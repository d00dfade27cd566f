"""Attention backends: `create_attention_backend(name)` picks one by name or device."""

from .base import (
    AttentionBackend,
    AttentionBatch,
    AttentionLayerInfo,
    KVPool,
    ReqToTokenPool,
    create_attention_backend,
)

__all__ = [
    "AttentionBackend",
    "AttentionBatch",
    "AttentionLayerInfo",
    "KVPool",
    "ReqToTokenPool",
    "create_attention_backend",
]
