"""KV memory: request slots -> KV indices (`ReqToTokenPool`) and the paged KV tensors (`TokenToKVPool`).

Runs in the scheduler process. KV slots are handed out in pages of `page_size` tokens by a
free-page allocator; slot 0 (page 0) is reserved as the padding target and never allocated, so
index 0 can safely fill padded index tensors. No request ever owns a contiguous KV tensor: its
tokens' slots are listed in its row of `req_to_token`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixgen.kernels.device_io import upload
from radixgen.kernels.kv_quant import KVCacheFormat, quantize_kv, resolve_kv_cache_format


@dataclass
class KVBlock:
    """KV of some tokens outside the pool: [layers, tokens, kv heads, head dim] K and V in the
    pool's storage dtype (fp8 as its raw bytes), and float32 [layers, tokens, kv heads] scales
    for a scaled format."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    def tokens(self, start: int, end: int) -> KVBlock:
        """Tokens [start, end) of this block (views)."""

        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[:, start:end]

        return KVBlock(
            self.k[:, start:end], self.v[:, start:end], cut(self.k_scale), cut(self.v_scale)
        )

    @staticmethod
    def cat(blocks: list[KVBlock]) -> KVBlock:
        """Blocks joined along the token axis."""

        def join(ts: list[torch.Tensor | None]) -> torch.Tensor | None:
            return None if ts[0] is None else torch.cat([t for t in ts if t is not None], dim=1)

        k = torch.cat([b.k for b in blocks], dim=1)
        v = torch.cat([b.v for b in blocks], dim=1)
        return KVBlock(k, v, join([b.k_scale for b in blocks]), join([b.v_scale for b in blocks]))

    def nbytes(self) -> int:
        parts = [self.k, self.v, self.k_scale, self.v_scale]
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


class ReqToTokenPool:
    """One row per running request: the KV slot of each of its token positions.

    NOTE: `req_to_token` (host) is the scheduler's table: planning and the prefix cache read it
    without touching the device. Off the CPU, `device_req_to_token` mirrors it for the attention
    kernels; every write goes through `write` / `write_row`, which update both (host-to-device
    copies only, never a device-to-host read).
    """

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu") -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.long)
        self.device = torch.device(device)
        self.mirrored = self.device.type != "cpu"
        self.device_req_to_token = (
            torch.zeros((size, max_context_len), dtype=torch.long, device=self.device)
            if self.mirrored
            else self.req_to_token
        )
        self._free: list[int] = list(range(size))

    def write(self, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor) -> None:
        """req_to_token[rows[i], cols[i]] = slots[i] (host tensors), on both tables."""
        self.req_to_token[rows, cols] = slots
        if self.mirrored:
            n = int(rows.numel())
            moved = upload(torch.cat([rows, cols, slots.to(torch.long)]), self.device)
            self.device_req_to_token[moved[:n], moved[n : 2 * n]] = moved[2 * n :]

    def write_row(self, row: int, start: int, slots: torch.Tensor) -> None:
        """req_to_token[row, start : start + len(slots)] = slots (a host tensor), on both."""
        end = start + slots.numel()
        self.req_to_token[row, start:end] = slots
        if self.mirrored:
            self.device_req_to_token[row, start:end].copy_(upload(slots, self.device))

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, slot: int) -> None:
        assert slot not in self._free, f"request slot {slot} freed twice"
        self._free.append(slot)

    def clear(self) -> None:
        self._free = list(range(self.size))


class TokenToKVPool:
    """K and V tensors for every layer, [num_slots, kv_heads, head_dim] each, plus the allocator.

    `dtype` is the model's; `kv_format` says how K/V are stored (default: in the model dtype).
    A scaled format (int8) keeps float32 [num_slots, kv_heads] scales per layer beside K and V,
    indexed by the same slot, so the prefix cache and the allocator, which move slot indices
    only, are the same for every format.
    """

    def __init__(
        self,
        max_total_tokens: int,
        page_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        kv_format: KVCacheFormat | None = None,
    ) -> None:
        self.page_size = page_size
        self.num_pages = max_total_tokens // page_size
        self.size = self.num_pages * page_size  # usable tokens
        total_slots = self.size + page_size  # + the reserved padding page
        self.dtype = dtype
        self.device = device
        self.kv_format = kv_format or resolve_kv_cache_format("auto", dtype)
        storage = self.kv_format.storage
        shape = (num_layers, total_slots, num_kv_heads, head_dim)
        # NOTE: only the padding page must be zero (padded attention rows read it); fresh slots
        # are always written before they are read, so the rest stays uninitialised (fast start).
        self.k_buffer = torch.empty(shape, dtype=storage, device=device)
        self.v_buffer = torch.empty(shape, dtype=storage, device=device)
        self.k_buffer[:, :page_size].zero_()
        self.v_buffer[:, :page_size].zero_()
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        if self.kv_format.scaled:
            self.k_scale = torch.zeros(shape[:3], dtype=torch.float32, device=device)
            self.v_scale = torch.zeros(shape[:3], dtype=torch.float32, device=device)
        self.clear()

    # --- allocator --------------------------------------------------------------------------

    def clear(self) -> None:
        # Pages 1..num_pages; page 0 is the padding page.
        self._free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.long)
        self._release_buffer: list[torch.Tensor] = []

    def available_size(self) -> int:
        self._merge_released()
        return int(self._free_pages.numel()) * self.page_size

    def alloc(self, num_tokens: int) -> torch.Tensor | None:
        """Whole fresh pages for `num_tokens` tokens (page_size 1: exactly that many slots)."""
        self._merge_released()
        pages_needed = -(-num_tokens // self.page_size)
        if pages_needed > self._free_pages.numel():
            return None
        pages = self._free_pages[:pages_needed]
        self._free_pages = self._free_pages[pages_needed:]
        if self.page_size == 1:
            return pages.clone()
        slots = (pages[:, None] * self.page_size + torch.arange(self.page_size)).flatten()
        return slots[:num_tokens].clone()

    def alloc_extend(
        self, prefix_lens: list[int], extend_lens: list[int], last_locs: list[int]
    ) -> torch.Tensor | None:
        """Slots for each request's next `extend_len` tokens after `prefix_len` cached ones.

        With pages, a request first fills the free tail of its last page (`last_loc` is the slot of
        its last cached token, or -1), then takes fresh pages. Returns the slots in batch order.
        """
        total = sum(extend_lens)
        if self.page_size == 1:
            return self.alloc(total)
        parts: list[torch.Tensor] = []
        fresh_needed = 0
        plans: list[tuple[int, int]] = []
        for prefix, ext, last in zip(prefix_lens, extend_lens, last_locs, strict=True):
            in_tail = 0
            if prefix % self.page_size and last >= 0:
                in_tail = min(ext, self.page_size - prefix % self.page_size)
            plans.append((in_tail, ext - in_tail))
            fresh_needed += -(-(ext - in_tail) // self.page_size)
        self._merge_released()
        if fresh_needed > self._free_pages.numel():
            return None
        for (in_tail, fresh), last in zip(plans, last_locs, strict=True):
            if in_tail:
                parts.append(torch.arange(last + 1, last + 1 + in_tail, dtype=torch.long))
            if fresh:
                pages = self.alloc(fresh)
                assert pages is not None, "free pages were counted above"
                parts.append(pages)
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)

    def free(self, slots: torch.Tensor) -> None:
        """Return slots; with pages, every page touched is returned whole (callers free whole pages)."""
        if slots.numel() == 0:
            return
        if self.page_size == 1:
            self._release_buffer.append(slots)
        else:
            self._release_buffer.append(torch.unique(slots // self.page_size))

    def _merge_released(self) -> None:
        if self._release_buffer:
            self._free_pages = torch.cat([self._free_pages, *self._release_buffer])
            self._release_buffer = []

    def free_slot_set(self) -> set[int]:
        """Every free slot (debug accounting only)."""
        self._merge_released()
        pages = self._free_pages.tolist()
        if self.page_size == 1:
            return set(pages)
        return {p * self.page_size + o for p in pages for o in range(self.page_size)}

    # --- data -------------------------------------------------------------------------------

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def get_kv_scales(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The layer's float32 [slots, kv heads] K and V scales (None: an unscaled format)."""
        if self.k_scale is None or self.v_scale is None:
            return None
        return self.k_scale[layer_id], self.v_scale[layer_id]

    def set_kv(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [N, kv heads, head dim] in any float dtype, stored (quantized) at `slots`."""
        scales = self.get_kv_scales(layer_id)
        for buf, x, i in ((self.k_buffer, k, 0), (self.v_buffer, v, 1)):
            data, scale = quantize_kv(x, self.kv_format, self.dtype)
            if data.dtype == torch.float8_e4m3fn:  # NOTE: torch has no fp8 index_copy_
                buf[layer_id].view(torch.uint8).index_copy_(0, slots, data.view(torch.uint8))
            else:
                buf[layer_id].index_copy_(0, slots, data)
            if scales is not None and scale is not None:
                scales[i].index_copy_(0, slots, scale)

    def read_slots(self, slots: torch.Tensor) -> KVBlock:
        """A host copy of every layer's K, V (and scales) at `slots`, exactly as stored, for a
        lower cache tier (`write_slots` puts it back bit for bit)."""
        idx = slots.to(self.k_buffer.device)

        def take(buf: torch.Tensor) -> torch.Tensor:
            raw = buf.view(torch.uint8) if buf.dtype == torch.float8_e4m3fn else buf
            return raw[:, idx].to("cpu", copy=True)

        k_scale = take(self.k_scale) if self.k_scale is not None else None
        v_scale = take(self.v_scale) if self.v_scale is not None else None
        return KVBlock(take(self.k_buffer), take(self.v_buffer), k_scale, v_scale)

    def write_slots(self, slots: torch.Tensor, block: KVBlock) -> None:
        """Store a `read_slots` copy (of len(slots) tokens) at `slots`."""
        idx = slots.to(self.k_buffer.device)
        pairs = [(self.k_buffer, block.k), (self.v_buffer, block.v)]
        if self.k_scale is not None and self.v_scale is not None:
            assert block.k_scale is not None and block.v_scale is not None, "scales missing"
            pairs += [(self.k_scale, block.k_scale), (self.v_scale, block.v_scale)]
        for buf, data in pairs:
            raw = buf.view(torch.uint8) if buf.dtype == torch.float8_e4m3fn else buf
            raw[:, idx] = data.to(raw.device)

    def bytes_per_token(self) -> int:
        """What one token costs in this pool: K, V and their scales, every layer."""
        total = 2 * self.k_buffer[:, 0].numel() * self.k_buffer.element_size()
        if self.k_scale is not None:
            total += 2 * self.k_scale[:, 0].numel() * self.k_scale.element_size()
        return total


def kv_capacity_tokens(budget_bytes: float, bytes_per_token: int, page_size: int) -> int:
    """How many tokens a KV budget holds (at least 64 pages, at most 2**20 tokens)."""
    tokens = int(budget_bytes // bytes_per_token)
    return max(page_size * 64, min(tokens, 1 << 20))
