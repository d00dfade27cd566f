"""The file tier of the hierarchical prefix cache (`--hicache-storage-backend file`): KV blocks
in a directory that outlives the process, so a prefix prefilled before a restart is loaded from
disk after it instead of being prefilled again.

Runs in the scheduler process. One file per block, named by the KV validity digest (model,
weights, tokenizer, dtypes, page and block size, layout: `kv_validity_digest`) and the block's
prefix hash chain key (`prefix_hash.py`). Each file carries a header that repeats both and a
checksum of its payload; a file that is truncated, corrupt or written for other KV is never
served: it is skipped (and removed) and the block is recomputed. Files are written to a private
temporary name and renamed into place (`os.replace`), so readers, and other servers sharing the
directory, see a whole entry or none. The directory has a size cap (oldest use first out); at
start the entries of this digest are indexed by their names, oldest use first (mtime).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import torch

from radixgen.runtime.mem_cache.host_tier import TierStats
from radixgen.runtime.mem_cache.memory_pool import KVBlock

logger = logging.getLogger(__name__)

MAGIC = b"RGKV1\n"
SUFFIX = ".kv"
STALE_TMP_SECONDS = 600.0  # a temporary file this old belongs to a writer that died
_DTYPES = {
    str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8)
}
_FIELDS = ("k", "v", "k_scale", "v_scale")


def kv_validity_digest(parts: Mapping[str, object]) -> bytes:
    """A digest of everything that makes stored KV valid for this server (its JSON, sorted)."""
    return hashlib.blake2b(json.dumps(parts, sort_keys=True).encode(), digest_size=16).digest()


def model_identity(folder: str | None) -> dict[str, object]:
    """The model folder's identity: config and tokenizer contents' digests, and each weight
    file's name, size and modification time (hashing the weights would cost seconds a start)."""
    if folder is None:
        return {}
    root = Path(folder)
    out: dict[str, object] = {"path": str(root.resolve())}
    for p in sorted(root.iterdir()) if root.is_dir() else [root]:
        if not p.is_file():
            continue
        if p.suffix in (".json", ".model", ".txt", ".jinja"):
            out[p.name] = hashlib.blake2b(p.read_bytes(), digest_size=16).hexdigest()
        elif p.suffix in (".safetensors", ".bin", ".gguf", ".pt"):
            st = p.stat()
            out[p.name] = [st.st_size, st.st_mtime_ns]
    return out


def encode_block(validity: bytes, key: bytes, block: KVBlock) -> bytes:
    """One entry file's bytes: magic, header length, JSON header, payload."""
    tensors = [(name, getattr(block, name)) for name in _FIELDS]
    present = [(name, t.contiguous()) for name, t in tensors if t is not None]
    payload = b"".join(t.view(torch.uint8).numpy().tobytes() for _, t in present)
    header = json.dumps(
        {
            "validity": validity.hex(),
            "key": key.hex(),
            "tensors": [[name, str(t.dtype), list(t.shape)] for name, t in present],
            "checksum": hashlib.blake2b(payload, digest_size=16).hexdigest(),
        }
    ).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + payload


def decode_block(raw: bytes, validity: bytes, key: bytes) -> KVBlock | None:
    """The block of an entry file's bytes, or None when it is not a whole, intact entry of
    this validity digest and key."""
    try:
        if not raw.startswith(MAGIC):
            return None
        (hlen,) = struct.unpack_from("<I", raw, len(MAGIC))
        start = len(MAGIC) + 4
        header = json.loads(raw[start : start + hlen])
        if header["validity"] != validity.hex() or header["key"] != key.hex():
            return None
        payload = memoryview(raw)[start + hlen :]
        if hashlib.blake2b(payload, digest_size=16).hexdigest() != header["checksum"]:
            return None
        parts: dict[str, torch.Tensor] = {}
        offset = 0
        for name, dtype_name, shape in header["tensors"]:
            dtype = _DTYPES[dtype_name]
            count = 1
            for s in shape:
                count *= int(s)
            nbytes = count * dtype.itemsize
            if name not in _FIELDS or offset + nbytes > len(payload):
                return None
            chunk = bytearray(payload[offset : offset + nbytes])
            parts[name] = torch.frombuffer(chunk, dtype=torch.uint8).view(dtype).reshape(shape)
            offset += nbytes
        if offset != len(payload) or "k" not in parts or "v" not in parts:
            return None
        return KVBlock(parts["k"], parts["v"], parts.get("k_scale"), parts.get("v_scale"))
    except (ValueError, KeyError, TypeError, struct.error, RuntimeError):
        return None


class FileKVTier:
    """Blocks in `directory`, at most `capacity_bytes` of them, least recently used out first."""

    def __init__(self, directory: str | Path, capacity_bytes: int, validity: bytes) -> None:
        self.dir = Path(directory).expanduser()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.capacity_bytes = max(0, capacity_bytes)
        self.validity = validity
        self.prefix = validity.hex()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # key -> file bytes, LRU first
        self.used_bytes = 0
        self.stats = TierStats()
        self.bad_entries = 0  # corrupt, truncated or foreign entries skipped
        self._reindex()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    def _path(self, key: bytes) -> Path:
        return self.dir / f"{self.prefix}-{key.hex()}{SUFFIX}"

    def _reindex(self) -> None:
        """Index this digest's entries by name, oldest use first; remove dead writers' files."""
        found: list[tuple[int, bytes, int]] = []
        head = self.prefix + "-"
        now = time.time()
        for entry in os.scandir(self.dir):
            name = entry.name
            try:
                if name.endswith(".tmp"):
                    if now - entry.stat().st_mtime > STALE_TMP_SECONDS:
                        os.unlink(entry.path)
                    continue
                if not (name.startswith(head) and name.endswith(SUFFIX)):
                    continue  # another server's KV (other model, dtype, ...) or not ours
                key = bytes.fromhex(name[len(head) : -len(SUFFIX)])
                st = entry.stat()
            except (ValueError, OSError):
                continue
            found.append((st.st_mtime_ns, key, st.st_size))
        for _, key, size in sorted(found):
            self._index[key] = size
            self.used_bytes += size
        self._enforce_cap()

    def _drop(self, key: bytes) -> None:
        size = self._index.pop(key, 0)
        self.used_bytes -= size
        try:
            os.unlink(self._path(key))
        except OSError:
            pass  # already gone (another server sharing the directory removed it)

    def _enforce_cap(self) -> None:
        while self.used_bytes > self.capacity_bytes and self._index:
            self._drop(next(iter(self._index)))
            self.stats.evicted_blocks += 1

    def put(self, key: bytes, block: KVBlock) -> None:
        """Write the block unless the directory holds it (atomically: a temporary file, renamed)."""
        if key in self._index:
            self._index.move_to_end(key)
            return
        data = encode_block(self.validity, key, block)
        if len(data) > self.capacity_bytes:
            return
        path = self._path(key)
        tmp = self.dir / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            logger.warning("hicache file tier: cannot write %s: %s", path, e)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        self._index[key] = len(data)
        self.used_bytes += len(data)
        self.stats.stored_blocks += 1
        self._enforce_cap()

    def get(self, key: bytes) -> KVBlock | None:
        """The block if the directory holds an intact entry for it; a bad entry is removed."""
        if key not in self._index:
            return None
        path = self._path(key)
        try:
            raw = path.read_bytes()
        except OSError:
            self._drop(key)
            return None
        block = decode_block(raw, self.validity, key)
        if block is None:
            logger.warning("hicache file tier: skipping a corrupt or foreign entry %s", path)
            self.bad_entries += 1
            self._drop(key)
            return None
        self._index.move_to_end(key)
        try:
            os.utime(path)  # its use survives a restart's re-index
        except OSError:
            pass
        return block

    def clear(self) -> None:
        """Remove every entry of this digest (another digest's files are not ours)."""
        for key in list(self._index):
            self._drop(key)
