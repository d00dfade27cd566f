"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2) whose attention reads the paged KV pool.

Runs in the scheduler process. The batch is flat: N new tokens from many requests, each with its
own position; the attention backend knows which request each token belongs to. Weights use Hugging
Face names, with q/k/v and gate/up fused into one matmul each.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar, Self

import torch
import torch.nn.functional as F
from torch import nn

from radixgen.errors import InvalidRequestError
from radixgen.kernels.attention.base import AttentionLayerInfo, kv_scales
from radixgen.kernels.cpu import NativeKernels
from radixgen.runtime.layers.linear import Linear, PackedWeight, linear, prepack_weight
from radixgen.runtime.models.model_config import ModelArchConfig
from radixgen.runtime.models.native_stack import NativeDecoderStack, StackLayerTypes

if TYPE_CHECKING:
    from radixgen.kernels.cpu import QuantLinearWeight
    from radixgen.kernels.layer_ops import FusedLayerOps
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch

    RaggedLayout = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def packed_dtype(model: nn.Module) -> torch.dtype:
    """The model's dense dtype (that of its norms), for the empty stand-ins of freed weights."""
    return next(model.parameters()).dtype


def _bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, "model_path")


class RMSNorm(nn.Module):
    native: FusedLayerOps | None = None  # fused add + norm in one call (set by `prepack`)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Norm of x (+ residual); with a residual returns (normed, new residual) like a fused add-norm.

        NOTE: the residual stream is kept in float32 whatever the model dtype: over 30 layers bf16
        rounding of the running sum moves greedy choices at near-ties; the adds are cheap.
        """
        if self.native is not None and residual is not None:
            out = self.native.add_rmsnorm(x.contiguous(), residual, self.weight, self.eps)
            return out, residual  # the residual was updated in place
        if self.native is not None and x.dim() == 2 and x.is_cpu:
            # the native stack's layer-0 norm: its per-layer path is bitwise the stack's
            return self.native.add_rmsnorm(None, x.float().contiguous(), self.weight, self.eps)
        if residual is not None:
            x = residual + x.float()
            residual = x
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(self.weight.dtype)
        normed = normed * self.weight
        return normed if residual is None else (normed, residual)


def _inv_freq(cfg: ModelArchConfig) -> torch.Tensor:
    inv = _scaled_inv_freq(cfg)
    if cfg.rope_freq_factors:  # llama.cpp divides each frequency by its factor
        inv = inv / torch.tensor(cfg.rope_freq_factors, dtype=inv.dtype)
    return inv


def _scaled_inv_freq(cfg: ModelArchConfig) -> torch.Tensor:
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise _bad(f"rope scaling type {kind!r} is not supported (default, linear, llama3)")


class RotaryEmbedding(nn.Module):
    """Half-split (NeoX-style) rotary embedding with a precomputed cos/sin table."""

    def __init__(self, cfg: ModelArchConfig, max_positions: int) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        # NOTE: computed on the CPU even inside a meta-device context: meta pow/cos/sin import
        # torch._dynamo (over a second of start-up) and a meta table would be garbage anyway.
        with torch.device("cpu"):
            inv = _inv_freq(cfg)
            t = torch.arange(max_positions, dtype=torch.int64).float()
            freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q: [N, H, D], k: [N, Hkv, D] -> rotated copies."""
        cos = self.cos[positions].to(q.dtype).unsqueeze(1)
        sin = self.sin[positions].to(q.dtype).unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    native: FusedLayerOps | None = None  # rotary + KV store fused (set by `prepack`)

    def __init__(self, cfg: ModelArchConfig, layer_id: int) -> None:
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = self.h * self.d, self.hkv * self.d
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        window = cfg.layer_sliding_windows[layer_id] if cfg.layer_sliding_windows else None
        self.info = AttentionLayerInfo(layer_id, self.h, self.hkv, self.d, self.d**-0.5, window)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        n = x.shape[0]
        backend = batch.attn_backend
        assert backend is not None  # set by ModelRunner.forward
        # NOTE: the native path takes float32 projections where the GEMM can give them: rotary
        # runs in float32 and q, k, v are rounded to bf16 once instead of three times (the
        # residual stream, o_proj and down_proj likewise stay float32; see `linear`). On CUDA
        # the torch matmul returns the model dtype: the Triton ops then round as torch does.
        qkv = self.project_qkv(x)
        if self.native is not None:  # rotary + KV store in one call, straight into the pool
            k_buf, v_buf = backend.kv_pool.get_kv_buffer(self.info.layer_id)
            q = self.native.rope_store_kv(
                qkv, positions, rotary.cos, rotary.sin, k_buf, v_buf, batch.out_cache_loc,
                self.h, self.hkv, self.d, x.dtype, kv_scales(backend.kv_pool, self.info.layer_id),
            )  # fmt: skip
            out = backend.forward(q.view(n, self.q_size), None, None, self.info, batch)
            return self.o_proj.forward(out, unrounded=True)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = rotary(positions, q.view(n, self.h, self.d), k.view(n, self.hkv, self.d))
        out = backend.forward(
            q.reshape(n, self.q_size), k.reshape(n, self.kv_size), v, self.info, batch
        )
        return self.o_proj(out)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """The fused [N, (H + 2 Hkv) D] projection before rotary (a hook for per-head q/k norms)."""
        return self.qkv_proj.forward(x, unrounded=self.native is not None)


class MLP(nn.Module):
    native: FusedLayerOps | None = None  # silu(gate) * up in one call (set by `prepack`)

    def __init__(self, cfg: ModelArchConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        self.inter = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * self.inter, bias=cfg.mlp_bias)
        self.down_proj = Linear(self.inter, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None:  # float32 between the two matmuls (see Attention.forward)
            gate_up = self.gate_up_proj.forward(x, unrounded=True)
            return self.down_proj.forward(self.native.silu_mul(gate_up, x.dtype), unrounded=True)
        gate_up = self.gate_up_proj(x)
        gate, up = gate_up.split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    # NOTE: other architectures (qwen3.py, moe.py, ...) swap parts through these hooks
    attention_cls: ClassVar[type[Attention]] = Attention

    def __init__(self, cfg: ModelArchConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = self.attention_cls(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp: nn.Module = self.make_mlp(cfg, layer_id)

    def make_mlp(self, cfg: ModelArchConfig, layer_id: int) -> nn.Module:
        """The feed-forward block of layer `layer_id` (dense here; MoE models override)."""
        return MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = x.float()
            h = self.input_layernorm.forward(x)
        else:
            h, residual = self.input_layernorm.forward(x, residual)
        h = self.self_attn.forward(h, positions, rotary, batch)
        h, residual = self.post_attention_layernorm.forward(h, residual)
        return self.mlp.forward(h), residual


class LlamaForCausalLM(nn.Module):
    """Covers LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM (biases per config)."""

    # NOTE: other architectures subclass this model and swap the layer and rotary classes
    layer_cls: ClassVar[type[DecoderLayer]] = DecoderLayer
    rotary_cls: ClassVar[type[RotaryEmbedding]] = RotaryEmbedding

    def __init__(self, cfg: ModelArchConfig, max_positions: int) -> None:
        super().__init__()
        self.cfg = cfg
        # NOTE: `_weight` skips nn.Embedding's random init, whose meta-device version imports
        # torch._dynamo (over a second of start-up); weights always come from the checkpoint.
        self.embed_tokens = nn.Embedding(
            cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size)
        )
        self.layers = nn.ModuleList(self.layer_cls(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = self.rotary_cls(cfg, max_positions)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))

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
        layer = self.layers[0]
        assert isinstance(layer, DecoderLayer)
        return layer.self_attn.info

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """Hidden states (after the final norm) at `batch.logits_indices` -> [M, hidden].

        NOTE: below this point submodules are called through `.forward`: `nn.Module.__call__`
        costs a few microseconds a call and a decode step makes ~270 of them (no hooks are used).
        """
        if self._embed_quant is not None:
            assert self._quant_kernels is not None
            x = self._quant_kernels.quant_rows(self._embed_quant, input_ids)
        else:
            x = self.embed_tokens(input_ids)
        native = self._native_stack(batch)
        if native is not None:  # every layer and the final norm in one native call, bitwise
            stack, layout = native  # the loop below
            return stack.forward(x, positions, batch.out_cache_loc, layout, batch.logits_indices)
        residual = None
        for layer in self.layers:
            x, residual = layer.forward(x, residual, positions, self.rotary, batch)
        idx = batch.logits_indices
        if idx is not None:
            x, residual = x[idx], residual[idx]
        h, _ = self.norm.forward(x, residual)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[M, vocab] in the model dtype (consumers convert the rows they need); float32 from a
        quantized head (exact: no near-tie re-scoring needed)."""
        if self._head_quant is not None:
            assert self._quant_kernels is not None
            return self._quant_kernels.linear_quant(hidden, self._head_quant, torch.float32)
        return linear(hidden, self.lm_head_weight, self._lm_head_packed, gemm=self._lm_head_gemm)

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
            types = StackLayerTypes(DecoderLayer, Attention, MLP, RMSNorm)
            self._stack = NativeDecoderStack.build(
                self, backend.kv_pool, self._stack_kernels, types
            )
            self._stack_pool = backend.kv_pool
        return None if self._stack is None else (self._stack, layout)

    def release_step_memory(self) -> None:
        """Drop what steps keep for the next one (the native stack's workspace): for idle time."""
        if self._stack is not None:
            self._stack.release_workspace()

    _stack_kernels: NativeKernels | None = None  # set by `prepack` when the stack may run
    _stack: NativeDecoderStack | None = None
    _stack_pool: object = None  # the KV pool `_stack` was built over

    _lm_head_packed: PackedWeight | None = None
    _lm_head_gemm: NativeKernels | None = None
    _embed_quant: QuantLinearWeight | None = None  # embedding rows dequantized on lookup
    _head_quant: QuantLinearWeight | None = None  # the LM head kept quantized
    _quant_kernels: NativeKernels | None = None

    def set_quantized_embedding(
        self, name: str, packed: QuantLinearWeight, kernels: NativeKernels
    ) -> None:
        """Serve the embedding (and a tied head) or the untied head from a quantized weight;
        the dense parameter is freed."""
        self._quant_kernels = kernels
        empty = nn.Parameter(torch.empty(0, dtype=packed_dtype(self)), requires_grad=False)
        if name == "lm_head.weight":
            self._head_quant = packed
            self.lm_head = empty
            return
        self._embed_quant = packed
        if self.cfg.tie_word_embeddings:
            self._head_quant = packed
        self.embed_tokens.weight = empty

    def prepack(
        self, native: FusedLayerOps | None = None, gemm: NativeKernels | None = None
    ) -> None:
        """Once the checkpoint is loaded: lay matmul weights out (for the native GEMM `gemm`,
        else oneDNN) and attach the fused layer ops `native` (rotary + KV store, add + RMSNorm,
        SiLU-mul: the native CPU kernels, or the Triton ones on CUDA). Both are the model
        runner's choice; None means the torch path. A linear layer's dense weight is freed once
        a packed copy serves it (the tied embedding / LM head stays dense)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.prepack(gemm)
                module.release_dense()
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.native = native
        if self._head_quant is None:
            self._lm_head_packed = prepack_weight(self.lm_head_weight, None, gemm)
            self._lm_head_gemm = gemm
        # NOTE: the stack's table holds the packed weights' pointers: rebuilt after a prepack.
        # It runs whenever the native kernels serve the layers: a layer packed for oneDNN (no
        # native bf16 GEMM: AMX or AVX2 CPUs) makes `NativeDecoderStack.build` decline the model
        self._stack_kernels = native if isinstance(native, NativeKernels) else None
        self._stack, self._stack_pool = None, None

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
