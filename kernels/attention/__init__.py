"""Attention backends: `create_attention_backend(name)` picks one by name or device."""

from .base import (
    AttentionBackend,
    AttentionBatch,
    AttentionLayerInfo,
    KVPool,
    ReqToTokenPool,
)
from .registry import ATTENTION_BACKENDS, create_attention_backend

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "AttentionBatch",
    "AttentionLayerInfo",
    "KVPool",
    "ReqToTokenPool",
    "create_attention_backend",
]
