"""What every decoder architecture shares around its layers: allocation, checkpoint loading,
prepacking, the forward over a flat batch and the logits (scheduler process).

An architecture (llama.py, qwen3.py, phi3.py, gemma2.py, moe.py) subclasses `CausalLM` and says
only how a layer is composed from runtime/layers (`make_layer`), which rotary table and final
norm it uses, and how its checkpoint names differ. Weights use Hugging Face names, with q/k/v
and gate/up fused into one matmul each.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

import psutil
import torch
from torch import nn

from radixgen.errors import InvalidRequestError
from radixgen.kernels.attention.base import AttentionLayerInfo
from radixgen.kernels.cpu import NativeKernels
from radixgen.kernels.step_cancel import raise_if_cancelled
from radixgen.runtime.layers.attention import Attention
from radixgen.runtime.layers.linear import Linear, onednn_packs_bf16
from radixgen.runtime.layers.mlp import MLP
from radixgen.runtime.layers.norm import RMSNorm
from radixgen.runtime.layers.rotary import RotaryEmbedding
from radixgen.runtime.layers.vocab import VocabHead, vocab_embedding
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.runtime.models.native_stack import NativeDecoderStack

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+; we support 3.10

    from radixgen.kernels.cpu import QuantLinearWeight
    from radixgen.kernels.layer_ops import FusedLayerOps
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch

    RaggedLayout = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

logger = logging.getLogger(__name__)

# the bf16 copies for wide steps (`CausalLM._add_wide_copies`) take at most this share of the
# memory available at load, so the KV pool sized after them keeps most of it
WIDE_COPY_MEMORY_SHARE = 0.25


def packed_dtype(model: nn.Module) -> torch.dtype:
    """The model's dense dtype (that of its norms), for the empty stand-ins of freed weights."""
    return next(model.parameters()).dtype


def _bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, "model_path")


class CausalLM(nn.Module):
    """embed_tokens -> layers -> norm, then the LM head (`lm_head`, or the tied embedding)."""

    # NOTE: an architecture picks its parts through these hooks and `make_layer`
    rotary_cls: ClassVar[type[RotaryEmbedding]] = RotaryEmbedding
    norm_cls: ClassVar[type[RMSNorm]] = RMSNorm
    # whether the native decoder stack may take this model (it still declines any layer that is
    # not exactly the pre-norm block of Attention, MLP and RMSNorm: see native_stack.py)
    native_stack_allowed: ClassVar[bool] = True

    def __init__(self, cfg: ModelArchConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = vocab_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.make_layer(cfg, i) for i in range(cfg.num_layers))
        self.norm = self.norm_cls(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = self.rotary_cls(cfg, max_positions)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.vocab = VocabHead()

    def make_layer(self, cfg: ModelArchConfig, layer_id: int) -> nn.Module:
        """Decoder layer `layer_id`, composed from runtime/layers."""
        raise NotImplementedError

    @classmethod
    def create(
        cls,
        cfg: ModelArchConfig,
        dtype: torch.dtype,
        device: str | torch.device,
        max_positions: int,
    ) -> Self:
        """An uninitialised model in `dtype` on `device`, ready for `load_weights`.

        Laid out on the meta device, then every parameter is allocated once with `torch.empty`
        in `dtype`: no random init, no fp32 copy to convert. (`Module.to_empty` would do the same
        through `empty_like`, whose meta path imports sympy: half a second of start-up.) The
        rotary table is real (float32) because no checkpoint holds it.
        """
        with torch.device("meta"):
            model = cls(cfg, max_positions=1)
        for module in model.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                empty = torch.empty(tuple(p.shape), dtype=dtype, device=device)
                setattr(module, name, nn.Parameter(empty, requires_grad=False))
        model.rotary = cls.rotary_cls(cfg, max_positions).to(device)
        return model.eval()

    def attention_layer_info(self) -> AttentionLayerInfo:
        """The first layer's attention geometry (heads, head dim, scale) for the backend."""
        attn = self.layers[0].self_attn
        assert isinstance(attn, Attention)
        return attn.info

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """The dense head (the re-scoring of bf16 logits reads it): a quantized head's bf16
        copy where one is kept for wide steps (`VocabHead.add_wide_copy`)."""
        if self.vocab.wide_dense is not None:
            return self.vocab.wide_dense
        return self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """Hidden states (after the final norm) at `batch.logits_indices` -> [M, hidden].

        NOTE: below this point submodules are called through `.forward`: `nn.Module.__call__`
        costs a few microseconds a call and a decode step makes ~270 of them (no hooks are used).
        """
        x = self.vocab.embed(self.embed_tokens, input_ids)
        # NOTE: the native stack runs the packed weights only: a step with adapter rows takes
        # the per-layer path, where each linear layer adds its LoRA delta (`Linear.delta`)
        # NOTE: ... and a step of `_wide_rows` rows or more too, to reach the layers' bf16 copies
        wide = self._wide_rows is not None and input_ids.shape[0] >= self._wide_rows
        native = self._native_stack(batch) if batch.lora_ids is None and not wide else None
        if native is not None:  # every layer and the final norm in one native call, bitwise
            stack, layout = native  # the loop below
            return stack.forward(
                x, positions, batch.out_cache_loc, layout, batch.logits_indices, batch.cancel
            )
        residual = None
        cancel = batch.cancel
        for layer in self.layers:
            raise_if_cancelled(cancel)
            x, residual = layer.forward(x, residual, positions, self.rotary, batch)
        assert residual is not None
        idx = batch.logits_indices
        if idx is not None:
            x, residual = x[idx], residual[idx]
        h: torch.Tensor = self.norm.forward(x, residual)[0]
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[M, vocab] in the model dtype (consumers convert the rows they need); float32 from a
        quantized head (exact: no near-tie re-scoring needed)."""
        return self.vocab.logits(hidden, self.lm_head_weight)

    def _native_stack(self, batch: ForwardBatch) -> tuple[NativeDecoderStack, RaggedLayout] | None:
        """The native decoder stack over this step's KV pool and the step's attention layout,
        when the stack can run the step."""
        backend = batch.attn_backend
        if self._stack_kernels is None or backend is None:
            return None
        layout = backend.native_ragged_layout()
        if layout is None:
            return None
        if self._stack_pool is not backend.kv_pool:  # built once per pool (None: not eligible)
            self._stack = NativeDecoderStack.build(self, backend.kv_pool, self._stack_kernels)
            self._stack_pool = backend.kv_pool
        return None if self._stack is None else (self._stack, layout)

    def release_step_memory(self) -> None:
        """Drop what steps keep for the next one (the native stack's workspace): for idle time."""
        if self._stack is not None:
            self._stack.release_workspace()

    _stack_kernels: NativeKernels | None = None  # set by `prepack` when the stack may run
    _stack: NativeDecoderStack | None = None
    _stack_pool: object = None  # the KV pool `_stack` was built over
    _wide_rows: int | None = None  # steps of this many rows use the layers' bf16 copies

    def set_quantized_embedding(
        self, name: str, packed: QuantLinearWeight, kernels: NativeKernels
    ) -> None:
        """Serve the embedding (and a tied head) or the untied head from a quantized weight;
        the dense parameter is freed."""
        empty = nn.Parameter(torch.empty(0, dtype=packed_dtype(self)), requires_grad=False)
        if name == "lm_head.weight":
            self.vocab.set_quantized(packed, kernels, embedding=False, head=True)
            self.lm_head = empty
            return
        tied = self.cfg.tie_word_embeddings
        self.vocab.set_quantized(packed, kernels, embedding=True, head=tied)
        self.embed_tokens.weight = empty

    def prepack(
        self,
        native: FusedLayerOps | None = None,
        gemm: NativeKernels | None = None,
        wide_rows: int | None = None,
    ) -> None:
        """Once the checkpoint is loaded: lay matmul weights out (for the native GEMM `gemm`,
        else oneDNN) and attach the fused layer ops `native` (rotary + KV store, add + RMSNorm,
        SiLU-mul: the native CPU kernels, or the Triton ones on CUDA). Both are the model
        runner's choice; None means the torch path. A linear layer's dense weight is freed once
        a packed copy serves it (the tied embedding / LM head stays dense)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.prepack(gemm)
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.native = native
        self.vocab.prepack(self.lm_head_weight, gemm)
        self._wide_rows = self._add_wide_copies(wide_rows) if wide_rows else None
        for module in self.modules():  # after the copies, which a dense layer makes from it
            if isinstance(module, Linear):
                module.release_dense()
        # NOTE: the stack's table holds the packed weights' pointers: rebuilt after a prepack.
        # It runs whenever the native kernels serve the layers: a layer packed for oneDNN (no
        # native bf16 GEMM: AMX or AVX2 CPUs) makes `NativeDecoderStack.build` decline the model
        self._stack_kernels = (
            native if isinstance(native, NativeKernels) and self.native_stack_allowed else None
        )
        self._stack, self._stack_pool = None, None

    @property
    def wide_rows(self) -> int | None:
        """Steps of this many rows use the layers' bf16 copies for oneDNN (None: none)."""
        return self._wide_rows

    def _add_wide_copies(self, rows: int) -> int | None:
        """Give every linear layer and the head a bf16 copy packed for oneDNN, for steps of
        `rows` rows or more (`Linear.add_wide_copy`; the model runner's choice,
        `select_wide_rows`): layers kept quantized, or packed for the native GEMM. Skipped
        when the copies would take more than WIDE_COPY_MEMORY_SHARE of the memory available
        now. Returns `rows` when every layer has one, else None."""
        if not onednn_packs_bf16():
            logger.info("no bf16 copies for wide steps: oneDNN cannot pack bf16 on this CPU")
            return None
        layers = [m for m in self.modules() if isinstance(m, Linear)]
        sizes = [m.wide_copy_bytes() for m in layers]
        head = self.vocab.wide_copy_bytes(self.lm_head_weight)
        if not layers or None in sizes or head is None:
            logger.info("no bf16 copies for wide steps: a layer is neither quantized nor packed "
                        "for the native GEMM")  # fmt: skip
            return None
        need = sum(s for s in sizes if s is not None) + head
        available = psutil.virtual_memory().available
        if need > WIDE_COPY_MEMORY_SHARE * available:
            logger.info(
                "no bf16 copies for wide steps: %.0f MB is over %.0f%% of the %.0f MB available",
                need / 2**20, 100 * WIDE_COPY_MEMORY_SHARE, available / 2**20,
            )  # fmt: skip
            return None
        if not all(m.add_wide_copy(rows) for m in layers) or not self.vocab.add_wide_copy(
            rows, self.lm_head_weight
        ):
            for m in layers:
                m.wide = None
            self.vocab.wide_packed = self.vocab.wide_dense = None
            return None
        logger.info("bf16 copies of the linear layers (%.0f MB) serve steps of %d+ rows",
                    need / 2**20, rows)  # fmt: skip
        return rows

    # --- weights ----------------------------------------------------------------------------

    _FUSED: ClassVar[dict[str, tuple[str, int]]] = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], absent: set[str] | None = None
    ) -> None:
        """Copy HF-named tensors (any float dtype) into our fused parameters.

        Every expected tensor must come exactly once with its exact shape; anything else is an
        InvalidRequestError naming the tensor, never a silent broadcast or a half-loaded model.
        absent: HF names the caller loads otherwise (weights kept quantized).
        """
        params = dict(self.named_parameters())
        expected = self.checkpoint_names() - (absent or set())
        loaded: set[str] = set()
        for raw_name, tensor in weights:
            if "rotary_emb" in raw_name:
                continue
            name = raw_name if raw_name.startswith(("model.", "lm_head.")) else f"model.{raw_name}"
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue  # some tied checkpoints also store the (identical) head
            if name not in expected:
                raise _bad(
                    f"checkpoint tensor {raw_name!r} has no place in {self.cfg.architecture}"
                )
            if name in loaded:
                raise _bad(f"checkpoint tensor {raw_name!r} appears twice")
            dest = self._destination(params, name)
            if tuple(dest.shape) != tuple(tensor.shape):
                raise _bad(
                    f"checkpoint tensor {raw_name!r} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(dest.shape)}"
                )
            with torch.no_grad():
                dest.copy_(tensor)
            loaded.add(name)
        missing = sorted(expected - loaded)
        if missing:
            raise _bad(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")

    def checkpoint_names(self) -> set[str]:
        """The Hugging Face tensor names a complete checkpoint of this model holds."""
        unfused = {v: k for k, v in self._FUSED.items()}
        names: set[str] = set()
        for pname, _ in self.named_parameters():
            if pname == "lm_head":
                names.add("lm_head.weight")
                continue
            parts = pname.split(".")
            if len(parts) >= 3 and parts[-2] in ("qkv_proj", "gate_up_proj"):
                n = 3 if parts[-2] == "qkv_proj" else 2
                for i in range(n):
                    sub = unfused[(parts[-2], i)]
                    names.add("model." + ".".join([*parts[:-2], sub, parts[-1]]))
            else:
                names.add(f"model.{pname}")
        return names

    def _destination(self, params: dict[str, nn.Parameter], name: str) -> torch.Tensor:
        """The parameter (or the slice of a fused one) that HF tensor `name` fills."""
        target, shard = self._target(name)
        dest: torch.Tensor = params[target]
        return dest if shard is None else dest[self._shard_slice(target, shard)]

    def _target(self, name: str) -> tuple[str, int | None]:
        """HF name -> (our parameter name, shard index within a fused parameter or None)."""
        if name == "lm_head.weight":
            return "lm_head", None
        parts = name[len("model.") :].split(".")
        if len(parts) >= 3 and parts[-2] in self._FUSED:
            fused, shard = self._FUSED[parts[-2]]
            return ".".join([*parts[:-2], fused, parts[-1]]), shard
        return ".".join(parts), None

    def _shard_slice(self, target: str, shard: int) -> slice:
        cfg = self.cfg
        if "qkv_proj" in target:
            q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
            bounds = [0, q, q + kv, q + 2 * kv]
        else:
            inter = cfg.intermediate_size
            bounds = [0, inter, 2 * inter]
        return slice(bounds[shard], bounds[shard + 1])
