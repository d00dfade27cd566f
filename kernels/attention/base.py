"""The attention backend contract: read and write the paged KV pool for extend and decode steps."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from radixgen.errors import InvalidRequestError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class AttentionLayerInfo:
    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    # keys within the last `sliding_window` positions only (p - W < k <= p); None = full
    sliding_window: int | None = None
    # scores become cap * tanh(scores / cap) before the softmax (Gemma 2): the torch backend's
    # pure-torch path and the triton backend implement it (the model runner routes the rest)
    logit_softcap: float | None = None


class KVPool(Protocol):
    """The per-layer K/V tensors of the pool, [slots, kv heads, head dim] each.

    A quantized pool (--kv-cache-dtype int8 / fp8_e4m3) stores int8 or float8 K/V; int8 ones
    also have float32 [slots, kv heads] scales (`kv_scales` below finds them).
    """

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def set_kv(
        self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None: ...


def kv_scales(pool: KVPool, layer_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The pool's per-token, per-head K and V scales of a layer, or None (unscaled storage)."""
    get = getattr(pool, "get_kv_scales", None)
    return None if get is None else get(layer_id)


def is_quantized_kv(t: torch.Tensor) -> bool:
    """Whether a K/V buffer holds quantized values (int8 or float8), not model-dtype ones."""
    return t.element_size() == 1


def refuse_converted_kv(pool: KVPool, backend: str) -> None:
    """The GPU backends read K/V in the model dtype only: a pool stored in another dtype
    (int8, fp8, bf16 under a float32 model) is refused rather than served untested."""
    k_buf, _ = pool.get_kv_buffer(0)
    model_dtype = getattr(pool, "dtype", k_buf.dtype)
    if k_buf.dtype != model_dtype:
        stored = str(k_buf.dtype).replace("torch.", "")
        raise InvalidRequestError(
            f"--kv-cache-dtype: the {backend} attention backend reads the KV cache in the model "
            f"dtype only, not {stored} (quantized KV runs on the CPU torch backend); use "
            "--kv-cache-dtype auto here",
            "kv_cache_dtype",
        )


class ReqToTokenPool(Protocol):
    """Request slot -> the KV pool slot of each of its positions.

    NOTE: the scheduler reads and writes the host table; attention kernels read
    `device_req_to_token`, its mirror on the compute device (the same tensor on CPU), which the
    pool keeps in step with every write.
    """

    req_to_token: torch.Tensor  # [request slots, max context] long, host
    device_req_to_token: torch.Tensor  # the same table where the KV pool lives


class AttentionBatch(Protocol):
    """What a backend reads of one step's batch (the runtime's ForwardBatch has all of it)."""

    out_cache_loc: torch.Tensor  # [N] KV slot of each new token
    req_pool_indices_cpu: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    extend_start_loc: list[int]


class AttentionBackend(ABC):
    """One implementation per device family.

    The scheduler builds a batch of requests, each with `prefix_len` tokens already in the KV
    pool and `extend_len` new tokens (decode is extend_len == 1). `init_forward_metadata` runs once
    per step; `forward` runs once per layer: it writes the new K/V at `out_cache_loc` and returns
    attention output for the new tokens, each attending to its own request's whole prefix.
    """

    kv_pool: KVPool
    # whether decode steps of this backend can be captured in CUDA graphs (the graph hooks below)
    supports_cuda_graph: bool = False

    @abstractmethod
    def init_forward_metadata(self, batch: AttentionBatch) -> None: ...

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayerInfo,
        batch: AttentionBatch,
    ) -> torch.Tensor:
        """q: [N, H*D], k/v: [N, Hkv*D] for the batch's N new tokens -> [N, H*D].

        k and v are None when the caller has already written them into the pool at
        `batch.out_cache_loc` (the fused rotary + KV-store kernel does).
        """

    def store_new_kv(
        self,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: AttentionLayerInfo,
        batch: AttentionBatch,
    ) -> None:
        """Write the step's new K/V ([N, Hkv*D] each) at `batch.out_cache_loc`; nothing when
        the caller has written them already (k and v None: the fused rotary + KV store)."""
        if k is None:
            return
        assert v is not None
        n, hkv, d = k.shape[0], layer.num_kv_heads, layer.head_dim
        self.kv_pool.set_kv(
            layer.layer_id, batch.out_cache_loc, k.view(n, hkv, d), v.view(n, hkv, d)
        )

    def native_ragged_layout(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """This step's layout for the native ragged CPU kernel (kv_indices, kv_indptr,
        q_indptr, q_pos0) when every layer attends through it, else None: the native decoder
        stack (runtime/models/native_stack.py) then runs attention itself."""
        return None

    # --- CUDA graphs (decode steps only) ------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_context_len: int) -> None:
        """Allocate, once and before any capture, the static buffers decode graphs read."""
        raise NotImplementedError(f"{type(self).__name__} does not run in CUDA graphs")

    def init_forward_metadata_graph(
        self, bs: int, req_rows: torch.Tensor, seq_lens: torch.Tensor, seq_lens_host: list[int]
    ) -> None:
        """Set the metadata of a decode step of `bs` rows (a captured bucket size) outside the
        graph: before capturing it, and before each replay.

        `req_rows` / `seq_lens` are the graph runner's static [bs] int32 device buffers, already
        filled for this step (padding rows: request slot 0, seq len 1, new-token KV slot 0 — the
        pool's padding page); `seq_lens_host` holds the same lengths on the host, for backends
        that plan on the host (flashinfer). Nothing here may allocate a new device tensor that a
        captured graph reads.
        """
        raise NotImplementedError(f"{type(self).__name__} does not run in CUDA graphs")
