"""The adapters a scheduler serves and the bounded pool of device slots they run from
(scheduler process).

Loaded adapters stay on the host (float32 factors, `adapter.py`); a step's adapters are swapped
into `--max-loras-per-batch` slots, least recently used out first, and the step's token rows are
grouped by slot once for every layer (`slots.py`). With --enable-lora off no manager exists and
no linear layer has a delta: the base path is unchanged.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixgen.errors import InvalidRequestError
from radixgen.runtime.layers.attention import Attention
from radixgen.runtime.layers.linear import Linear
from radixgen.runtime.lora.adapter import (
    TARGETS,
    LoraAdapter,
    load_adapter,
    refuse,
    resolve_target_modules,
)
from radixgen.runtime.lora.slots import LoraLinearSlots, LoraStepRows

if TYPE_CHECKING:
    from radixgen.runtime.model_executor.forward_batch import ForwardBatch
    from radixgen.server_args import LoraConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_RANK = 64  # --max-lora-rank when neither it nor --lora-paths says


def _shard_bounds(layer: nn.Module, linear_path: str, out_features: int) -> list[int]:
    """The fused output's shard boundaries of one of our linear layers."""
    if linear_path.endswith("qkv_proj"):
        attn = layer.get_submodule("self_attn")
        assert isinstance(attn, Attention)
        q, kv = attn.q_size, attn.kv_size
        return [0, q, q + kv, q + 2 * kv]
    if linear_path.endswith("gate_up_proj"):
        return [0, out_features // 2, out_features]
    return [0, out_features]


class LoraManager:
    """Host registry of adapters by name, the device slots, and each step's row groups."""

    def __init__(
        self,
        model: nn.Module,
        config: LoraConfig,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.allowed = resolve_target_modules(config.lora_target_modules)
        self.num_slots = config.max_loras_per_batch
        layers = model.get_submodule("layers")
        assert isinstance(layers, nn.ModuleList)
        self.num_layers = len(layers)
        self.base_shapes, self._linear_paths = self._base_shapes(layers[0])
        initial = config.named_paths()
        # NOTE: the slot width is fixed before any adapter is placed: the flag, else the widest
        # start-up adapter (read once with no rank bound, then checked like any other)
        first = [self._read(n, p, 1 << 30) for n, p in initial]
        if config.max_lora_rank is not None:
            self.max_rank = config.max_lora_rank
        else:
            self.max_rank = max((a.rank for a in first), default=DEFAULT_MAX_RANK)
        self.rows = LoraStepRows()
        # per decoder layer: our linear path -> its slots (attached as the layer's delta)
        self.layer_slots: list[dict[str, LoraLinearSlots]] = []
        for layer in layers:
            per: dict[str, LoraLinearSlots] = {}
            for path in self._linear_paths:
                lin = layer.get_submodule(path)
                assert isinstance(lin, Linear)
                bounds = _shard_bounds(layer, path, lin.out_features)
                slots = LoraLinearSlots(
                    self.rows, bounds, lin.in_features, self.num_slots, self.max_rank, dtype, device
                )
                lin.delta = slots
                per[path] = slots
            self.layer_slots.append(per)
        self.adapters: dict[str, LoraAdapter] = {}
        self.slot_of: OrderedDict[str, int] = OrderedDict()  # least recently used first
        for adapter in first:
            if adapter.rank > self.max_rank:
                raise refuse(
                    adapter.name, f"rank {adapter.rank} is over --max-lora-rank {self.max_rank}"
                )
            self.adapters[adapter.name] = adapter
        if first:
            logger.info("LoRA adapters loaded: %s", ", ".join(a.name for a in first))

    def _base_shapes(self, layer: nn.Module) -> tuple[dict[str, tuple[int, int]], list[str]]:
        """PEFT module name -> (in, out of its shard), and our linear paths with slots."""
        shapes: dict[str, tuple[int, int]] = {}
        paths: list[str] = []
        for module in sorted(self.allowed):
            path, shard = TARGETS[module]
            try:
                lin = layer.get_submodule(path)
            except AttributeError:
                continue  # e.g. an MoE block has no gate_up_proj: adapters of it are refused
            if not isinstance(lin, Linear):
                continue
            bounds = _shard_bounds(layer, path, lin.out_features)
            k = 0 if shard is None else shard
            if shard is None and len(bounds) > 2:
                bounds = [0, lin.out_features]
            shapes[module] = (lin.in_features, bounds[k + 1] - bounds[k])
            if path not in paths:
                paths.append(path)
        return shapes, paths

    def _read(self, name: str, path: str, max_rank: int) -> LoraAdapter:
        allowed = frozenset(self.base_shapes)
        return load_adapter(name, path, max_rank, allowed, self.base_shapes, self.num_layers)

    # --- the registry -------------------------------------------------------------------------

    def load(self, name: str, path: str) -> LoraAdapter:
        """Read, check and register an adapter (its slot is filled when a step needs it)."""
        if not name:
            raise InvalidRequestError("a LoRA adapter needs a name", "lora_name")
        if name in self.adapters:
            raise InvalidRequestError(f"LoRA adapter {name!r} is already loaded", "lora_name")
        adapter = self._read(name, path, self.max_rank)
        self.adapters[name] = adapter
        return adapter

    def unload(self, name: str) -> None:
        if name not in self.adapters:
            raise InvalidRequestError(f"LoRA adapter {name!r} is not loaded", "lora_name")
        del self.adapters[name]
        slot = self.slot_of.pop(name, None)
        if slot is not None:
            for per in self.layer_slots:
                for slots in per.values():
                    slots.clear(slot)

    def __contains__(self, name: object) -> bool:
        return name in self.adapters

    def cache_namespace(self, name: str) -> str:
        """The prefix cache's namespace of a loaded adapter: its content, not its name."""
        return self.adapters[name].digest

    # --- slots and steps ----------------------------------------------------------------------

    def _acquire(self, names: list[str]) -> dict[str, int]:
        """Slots for every adapter of a step (distinct, in the step's order): kept ones
        refreshed, others swapped in over the least recently used slots no adapter of this step
        holds."""
        if len(names) > self.num_slots:
            raise RuntimeError(
                f"a step has {len(names)} adapters, over --max-loras-per-batch {self.num_slots}"
            )
        for name in names:  # NOTE: the step's order is the recency order among its adapters
            if name in self.slot_of:
                self.slot_of.move_to_end(name)
                continue
            used = set(self.slot_of.values())
            free = [s for s in range(self.num_slots) if s not in used]
            if free:
                slot = free[0]
            else:
                victim = next(n for n in self.slot_of if n not in names)
                slot = self.slot_of.pop(victim)
            self._swap_in(self.adapters[name], slot)
            self.slot_of[name] = slot
        return {name: self.slot_of[name] for name in names}

    def _swap_in(self, adapter: LoraAdapter, slot: int) -> None:
        for per in self.layer_slots:
            for slots in per.values():
                slots.clear(slot)
        for (layer, module), w in adapter.modules.items():
            path, shard = TARGETS[module]
            self.layer_slots[layer][path].write(slot, shard, w.a, w.b, adapter.scaling)

    def begin_step(self, batch: ForwardBatch) -> None:
        """Group this step's token rows by adapter slot (requests without one run the base)."""
        names = batch.lora_ids
        assert names is not None
        slots = self._acquire(list(dict.fromkeys(n for n in names if n is not None)))
        ranges: dict[int, list[tuple[int, int]]] = {}
        for name, start, n in zip(names, batch.extend_start_loc, batch.extend_lens, strict=True):
            if name is not None and n > 0:
                ranges.setdefault(slots[name], []).append((start, start + n))
        self.rows.set(ranges, batch.input_ids.device)

    def end_step(self) -> None:
        self.rows.clear()
