"""Attention backends: `create_attention_backend(name)` picks one by name or device."""

from radixgen.kernels.attention.base import (
    AttentionBackend,
    AttentionLayerInfo,
    create_attention_backend,
)

__all__ = ["AttentionBackend", "AttentionLayerInfo", "create_attention_backend"]
