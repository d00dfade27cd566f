"""Convert a GGUF file once into a cached Hugging Face-style folder (config, safetensors, tokenizer).

Runs in the launcher (or a test) before the engine starts. Weights are read with the `gguf`
package, dequantized to float32 and renamed onto our (HF-named) modules; the tokenizer and chat
template come from the GGUF metadata through transformers' GGUF support, saved as tokenizer.json
so later starts load in well under a second. The cache key is the file's SHA-256.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from radixgen.runtime.model_loader.gguf_archs import (
    CONFIG_TENSORS,
    LAYER_OVERRIDES,
    arch_config,
    special_tensor,
    undo_norm_offset,
)

logger = logging.getLogger(__name__)

CONVERTER_VERSION = 1  # bump to invalidate caches when the conversion changes

# GGUF architecture name -> (HF architecture, HF model_type, whether q/k were permuted for rope)
_ARCHS: dict[str, tuple[str, str, bool]] = {
    "llama": ("LlamaForCausalLM", "llama", True),
    "mistral": ("MistralForCausalLM", "mistral", True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", False),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe", False),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe", False),
    "phi3": ("Phi3ForCausalLM", "phi3", False),
    "gemma2": ("Gemma2ForCausalLM", "gemma2", False),
}  # (a llama GGUF with experts is Mixtral: see gguf_archs.arch_config)

_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cached_file_digest(path: Path, cache_dir: Path) -> str:
    """The file's SHA-256 prefix, remembered per (path, size, mtime) so warm starts skip hashing."""
    st = path.stat()
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    memo = cache_dir / f".digest-{key}.json"
    stamp = {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        saved = json.loads(memo.read_text())
        if {k: saved.get(k) for k in stamp} == stamp:
            return str(saved["digest"])
    except (OSError, ValueError, KeyError):
        pass
    digest = file_sha256(path)[:20]
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**stamp, "digest": digest}))
        os.replace(tmp, memo)
    except OSError:  # a read-only cache still works, it just hashes every time
        pass
    return digest


def convert_gguf_cached(gguf_path: Path, cache_dir: Path) -> Path:
    """Return the converted folder for `gguf_path`, converting on the first call only."""
    digest = cached_file_digest(gguf_path, cache_dir)
    target = cache_dir / f"{gguf_path.stem}-{digest}-v{CONVERTER_VERSION}"
    if (target / "radixgen_done.json").exists():
        _keep_source_reachable(target, gguf_path, digest)
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    lock_path = cache_dir / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other processes converting the same file wait here
        if (target / "radixgen_done.json").exists():
            return target
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=cache_dir))
        try:
            convert_gguf(gguf_path, tmp)
            (tmp / "radixgen_done.json").write_text(
                json.dumps({"source": str(gguf_path), "sha256_prefix": digest})
            )
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        logger.info(
            "converted %s in %.1f s -> %s", gguf_path.name, time.perf_counter() - t0, target
        )
    return target


def _keep_source_reachable(target: Path, gguf_path: Path, digest: str) -> None:
    """Point a cached folder's record at `gguf_path` (same content: same digest) when the file
    it names is gone: the kept-quantized path reads its weights from the recorded GGUF, and a
    cache filled from a since-deleted virtual environment would otherwise leave every later
    load on the dequantized path (and `--quantization gguf` refused)."""
    done = target / "radixgen_done.json"
    try:
        recorded = Path(json.loads(done.read_text())["source"])
    except (OSError, ValueError, KeyError):
        recorded = None
    if recorded is not None and recorded.exists():
        return
    tmp = done.with_name(f".{done.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"source": str(gguf_path), "sha256_prefix": digest}))
    os.replace(tmp, done)  # atomic: a concurrent reader sees the old record or the new one
    logger.info("cached %s: its source is now %s", target.name, gguf_path)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config.json, model.safetensors (float32) and tokenizer files into `out_dir`.

    A GGUF without tokenizer metadata (`tokenizer.ggml.model`) converts its weights only.
    """
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    config, state = convert_gguf_weights(reader)
    from safetensors.numpy import save_file

    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    meta = _read_metadata(reader)
    if "tokenizer.ggml.model" in meta:
        _write_tokenizer(gguf_path, meta, config, out_dir)


_ROPE_FREQS = "rope_freqs.weight"


def convert_gguf_weights(reader: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(HF config dict, HF-named float32 arrays) from an open `gguf.GGUFReader`."""
    meta = _read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in _ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {sorted(_ARCHS)})"
        )
    tensor_names = {t.name for t in reader.tensors}
    config = _hf_config(meta, arch, tensor_names)
    config.update(arch_config(meta, arch, tensor_names, lambda name: _read_1d(reader, name)))
    if _ROPE_FREQS in tensor_names:
        # Llama 3.1+ rope scaling as llama.cpp stores it: one divisor per rotary frequency
        import gguf

        (t,) = [t for t in reader.tensors if t.name == _ROPE_FREQS]
        factors = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        config["rope_freq_factors"] = [float(f) for f in factors]
    state = dict(_convert_tensors(reader, config, arch))
    return config, state


def _read_metadata(reader: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key not in (
            "tokenizer.ggml.model",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.eot_token_id",
        ):
            continue  # vocab arrays are read by the tokenizer converter
        try:
            meta[key] = fld.contents()
        except Exception:  # pragma: no cover - exotic field types we do not need
            continue
    return meta


def _hf_config(meta: dict[str, Any], arch: str, tensor_names: set[str]) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    missing = [
        f"{arch}.{k}"
        for k in ("embedding_length", "attention.head_count", "feed_forward_length", "block_count")
        if get(k) is None
    ]
    if missing:
        raise ValueError(f"GGUF metadata lacks {missing}")
    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    kv_heads = int(get("attention.head_count_kv", heads))
    head_dim = int(get("attention.key_length", hidden // heads))
    rope_dims = int(get("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(
            f"partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported"
        )
    vocab = int(get("vocab_size", 0)) or None
    hf_arch, model_type, _ = _ARCHS[arch]
    config: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": int(get("context_length", 4096)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "float32",
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
    }
    if vocab:
        config["vocab_size"] = vocab
    window = get("attention.sliding_window")
    if window and model_type == "mistral":  # llama.cpp applies it to mistral only
        config["sliding_window"] = int(window)
    scaling_type = get("rope.scaling.type")
    if scaling_type and scaling_type != "none":
        config["rope_scaling"] = {
            "rope_type": scaling_type,
            "factor": float(get("rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(
                get("rope.scaling.original_context_length", config["max_position_embeddings"])
            ),
        }
    return config


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's rope-layout permutation of q/k rows (interleaved -> half-split)."""
    rows = w.shape[0]
    out: np.ndarray = (
        w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )
    return out


def _read_1d(reader: Any, name: str) -> np.ndarray:
    import gguf

    (t,) = [t for t in reader.tensors if t.name == name]
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)


def _convert_tensors(
    reader: Any, config: dict[str, Any], arch: str
) -> Iterator[tuple[str, np.ndarray]]:
    import gguf

    permuted = _ARCHS[arch][2]
    for t in reader.tensors:
        if t.name == _ROPE_FREQS or t.name in CONFIG_TENSORS:
            continue  # a config value (rope_freq_factors, longrope factors), not a weight
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        arr = np.ascontiguousarray(arr.astype(np.float32, copy=False))
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = arr.reshape(shape)
        m = _BLOCK_RE.match(t.name)
        special = special_tensor(arch, config, m[1], m[2], m[3], arr) if m else None
        if special is not None:  # MoE experts, routers and shared experts
            yield from special
            continue
        name = _hf_name(t.name, arch)
        arr = undo_norm_offset(arch, name, arr)
        # llama.cpp's converter permutes the rows of q/k weights AND biases
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
            arr = _unpermute(arr, config["num_attention_heads"])
        elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            arr = _unpermute(arr, config["num_key_value_heads"])
        if name == "model.embed_tokens.weight":
            config.setdefault("vocab_size", arr.shape[0])
        yield name, arr


def _hf_name(gguf_name: str, arch: str = "llama") -> str:
    m = _BLOCK_RE.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        table = {**_LAYER_TENSORS, **LAYER_OVERRIDES.get(arch, {})}
        if part not in table:
            raise ValueError(f"unknown GGUF tensor {gguf_name}")
        return f"model.layers.{layer}.{table[part]}.{kind}"
    base, _, kind = gguf_name.rpartition(".")
    if base not in _GLOBAL_TENSORS:
        raise ValueError(f"unknown GGUF tensor {gguf_name}")
    return f"{_GLOBAL_TENSORS[base]}.{kind}"


def _write_tokenizer(
    gguf_path: Path, meta: dict[str, Any], config: dict[str, Any], out_dir: Path
) -> None:
    """Build the fast tokenizer from GGUF metadata once and save it as tokenizer.json."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    template = meta.get("tokenizer.chat_template")
    if template and not getattr(tok, "chat_template", None):
        tok.chat_template = template
    tok.save_pretrained(str(out_dir))
    cfg_path = out_dir / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    if (
        template
        and "chat_template" not in tok_cfg
        and not (out_dir / "chat_template.jinja").exists()
    ):
        tok_cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(tok_cfg, indent=2))
    config["bos_token_id"] = tok.bos_token_id
    config["eos_token_id"] = tok.eos_token_id
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
