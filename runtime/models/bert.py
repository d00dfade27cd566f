"""BERT-family encoders (BertModel, XLMRobertaModel) and their cross-encoders
(`*ForSequenceClassification` with one label): token + absolute position + token-type
embeddings, LayerNorm, then post-norm encoder blocks (scheduler process).

The forward returns every token's final state; pooling to one vector is
runtime/layers/pooling.py's, and a cross-encoder's score is `score`'s (first token -> dense ->
tanh -> one logit: BERT's pooler + classifier, XLM-R's classification head). Checkpoints load
from Hugging Face names, with or without the `bert.` / `roberta.` prefix a task model adds; an
embedding model skips the pooler (a CLS-only head sentence-transformers does not use).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from radixgen.errors import InvalidRequestError
from radixgen.runtime.layers.encoder import PostNormEncoderLayer
from radixgen.runtime.layers.linear import Linear
from radixgen.runtime.layers.vocab import vocab_embedding
from radixgen.runtime.models.encoder_config import EncoderArchConfig

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+; we support 3.10

_PREFIXES = ("bert.", "roberta.", "model.")
_SKIPPED = ("embeddings.position_ids", "embeddings.token_type_ids")
# a cross-encoder's head: Hugging Face's names (BERT's, XLM-R's) -> ours
_HEAD_RENAMES = (
    ("pooler.dense.", "head.dense."),
    ("classifier.dense.", "head.dense."),
    ("classifier.out_proj.", "head.out."),
    ("classifier.", "head.out."),
)
# Hugging Face's names inside a layer -> ours, the longer name first
_RENAMES = (
    ("attention.self.query.", "attn.query."),
    ("attention.self.key.", "attn.key."),
    ("attention.self.value.", "attn.value."),
    ("attention.output.dense.", "attn.out."),
    ("attention.output.LayerNorm.", "attn_norm."),
    ("intermediate.dense.", "up."),
    ("output.dense.", "down."),
    ("output.LayerNorm.", "mlp_norm."),
)


def _bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, "model_path")


def hf_to_ours(name: str, cross_encoder: bool = False) -> str | None:
    """Our parameter name for a checkpoint tensor, or None for one we do not use."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if name.startswith(_SKIPPED) or (name.startswith("pooler.") and not cross_encoder):
        return None
    for hf, ours in _HEAD_RENAMES:
        if name.startswith(hf):
            return ours + name[len(hf) :]
    if name.startswith("encoder.layer."):
        layer, rest = name[len("encoder.layer.") :].split(".", 1)
        for hf, ours in _RENAMES:
            if rest.startswith(hf):
                return f"layers.{layer}.{ours}{rest[len(hf) :]}"
    return name


class EncoderEmbeddings(nn.Module):
    """word + position + token type, then LayerNorm (names as in the checkpoint)."""

    def __init__(self, cfg: EncoderArchConfig) -> None:
        super().__init__()
        self.word_embeddings = vocab_embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = vocab_embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = vocab_embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.position_offset = cfg.position_offset

    def forward(self, input_ids: torch.Tensor, token_types: torch.Tensor | None) -> torch.Tensor:
        """[B, L] right-padded ids (and segment ids; None: 0 everywhere) -> [B, L, H]."""
        n = input_ids.shape[1]
        positions = torch.arange(n, device=input_ids.device) + self.position_offset
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
        if token_types is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_types)
        out: torch.Tensor = self.LayerNorm(x)
        return out


class ClassificationHead(nn.Module):
    """first token -> dense -> tanh -> out: a cross-encoder's logits."""

    def __init__(self, hidden_size: int, num_labels: int) -> None:
        super().__init__()
        self.dense = Linear(hidden_size, hidden_size)
        self.out = Linear(hidden_size, num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, L, H] -> [B, num_labels] float32."""
        first = hidden[:, 0]
        return self.out.forward(torch.tanh(self.dense.forward(first))).float()


class BertModel(nn.Module):
    """embeddings -> post-norm layers (-> the classification head of a cross-encoder); serves
    BertModel, XLMRobertaModel and their one-label ForSequenceClassification models."""

    def __init__(self, cfg: EncoderArchConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = EncoderEmbeddings(cfg)
        self.layers = nn.ModuleList(
            PostNormEncoderLayer(
                cfg.hidden_size,
                cfg.num_heads,
                cfg.intermediate_size,
                cfg.layer_norm_eps,
                cfg.hidden_act,
            )
            for _ in range(cfg.num_layers)
        )
        if cfg.is_cross_encoder:
            self.head = ClassificationHead(cfg.hidden_size, cfg.num_labels)

    @classmethod
    def create(cls, cfg: EncoderArchConfig, dtype: torch.dtype, device: str | torch.device) -> Self:
        """Uninitialised in `dtype` on `device`, ready for `load_weights` (laid out on the meta
        device, then each parameter allocated once: no random init)."""
        with torch.device("meta"):
            model = cls(cfg)
        for module in model.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                empty = torch.empty(tuple(p.shape), dtype=dtype, device=device)
                setattr(module, name, nn.Parameter(empty, requires_grad=False))
        return model.eval()

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, token_types: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[B, L] right-padded ids and mask (1 on real tokens), optional segment ids -> [B, L, H]
        final states."""
        x: torch.Tensor = self.embeddings(input_ids, token_types)
        b, n, h = x.shape
        key_mask = mask.bool()[:, None, None, :]
        x = x.reshape(b * n, h)  # the layers work on rows; attention views them per sequence
        for layer in self.layers:
            x = layer(x, key_mask, (b, n))
        return x.view(b, n, h)

    @torch.inference_mode()
    def score(self, hidden: torch.Tensor) -> torch.Tensor:
        """A cross-encoder's logits [B, num_labels] from `forward`'s states."""
        return self.head.forward(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], pack: bool = True) -> None:
        """Every parameter exactly once with its exact shape; anything else names the tensor.
        Then each layer lays its weights out for its GEMMs (`PostNormEncoderLayer.prepack`;
        pack=False keeps plain F.linear, the oracle the packed path is tested against)."""
        if any(cast(PostNormEncoderLayer, layer).up_gemm is not None for layer in self.layers):
            raise RuntimeError("the weights were loaded and packed once: load into a fresh model")
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for raw_name, tensor in weights:
            name = hf_to_ours(raw_name, self.cfg.is_cross_encoder)
            if name is None:
                continue
            dest = params.get(name)
            if dest is None:
                raise _bad(
                    f"checkpoint tensor {raw_name!r} has no place in {self.cfg.architecture}"
                )
            if name in loaded:
                raise _bad(f"checkpoint tensor {raw_name!r} appears twice")
            if tuple(dest.shape) != tuple(tensor.shape):
                raise _bad(
                    f"checkpoint tensor {raw_name!r} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(dest.shape)}"
                )
            with torch.no_grad():
                dest.copy_(tensor)
            loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise _bad(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")
        for layer in self.layers:
            cast(PostNormEncoderLayer, layer).prepack(pack)
