"""Architecture facts of BERT-family encoders read from config.json (any process; no torch).

Kept apart from `ModelArchConfig` (decoders): an encoder has absolute position embeddings,
token types, post-norm LayerNorms and a GELU MLP, and none of a decoder's rotary, KV or head
facts. What the encoder code cannot honour is refused here, at load time, naming the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixgen.runtime.models.model_config import (
    config_error,
    missing_required_keys,
    read_config_json,
)

# architecture -> model_type (XLM-R shifts positions past its padding index, see `position_offset`)
ENCODER_ARCHITECTURES = {
    "BertModel": "bert",
    "XLMRobertaModel": "xlm-roberta",
    # cross-encoders (rerankers): the encoder and a one-score head on the first token
    "BertForSequenceClassification": "bert",
    "XLMRobertaForSequenceClassification": "xlm-roberta",
}
SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


def is_encoder_folder(folder: str | Path) -> bool:
    """Whether the folder's config names an encoder architecture (so it serves embeddings)."""
    archs = read_config_json(folder).get("architectures") or []
    return any(a in ENCODER_ARCHITECTURES for a in archs)


def serves_embeddings(is_embedding: bool, folder: str | Path) -> bool:
    """Whether the server embeds: `--is-embedding` (an encoder, or a decoder with last-token
    pooling), or a folder holding an encoder (its config says so)."""
    return is_embedding or is_encoder_folder(folder)


@dataclass(frozen=True)
class EncoderArchConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    pad_token_id: int
    # a cross-encoder's head outputs (1: one relevance score per pair); 0: an embedding model
    num_labels: int = 0

    @property
    def is_cross_encoder(self) -> bool:
        return self.num_labels > 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def position_offset(self) -> int:
        """First position id: XLM-R numbers tokens from padding_idx + 1 (fairseq's legacy)."""
        return self.pad_token_id + 1 if self.model_type == "xlm-roberta" else 0

    @property
    def max_tokens(self) -> int:
        """The longest sequence the position table holds."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_folder(cls, folder: str | Path) -> EncoderArchConfig:
        return cls.from_dict(read_config_json(folder))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EncoderArchConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in ENCODER_ARCHITECTURES), None)
        if arch is None:
            raise config_error(
                f"unsupported encoder architecture {archs} "
                f"(supported: {sorted(ENCODER_ARCHITECTURES)})"
            )
        missing = missing_required_keys(raw)
        if missing:
            raise config_error(f"config.json lacks {missing}")
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        if hidden % heads:
            raise config_error(
                f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
            )
        act = str(raw.get("hidden_act", "gelu"))
        if act not in SUPPORTED_ACTIVATIONS:
            raise config_error(
                f"hidden_act {act!r} is not supported ({', '.join(SUPPORTED_ACTIVATIONS)})"
            )
        num_labels = 0
        if arch.endswith("ForSequenceClassification"):
            num_labels = len(raw.get("id2label") or {}) or int(raw.get("num_labels", 2))
            if num_labels != 1:
                raise config_error(
                    f"{arch} with {num_labels} labels: only one-score cross-encoders (rerankers) "
                    "are served"
                )
        kind = raw.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise config_error(f"position_embedding_type {kind!r} is not supported (absolute only)")
        return cls(
            architecture=arch,
            model_type=ENCODER_ARCHITECTURES[arch],
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            max_position_embeddings=int(raw.get("max_position_embeddings", 512)),
            type_vocab_size=int(raw.get("type_vocab_size", 2)),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            hidden_act=act,
            pad_token_id=int(raw.get("pad_token_id") or 0),
            num_labels=num_labels,
        )
