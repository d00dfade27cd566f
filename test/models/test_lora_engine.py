"""LoRA adapters served by the offline Engine (real scheduler and detokenizer processes, radix
cache): each request's `lora_path` picks its adapter, a batch mixes adapters and the base with
fewer slots than adapters, greedy outputs equal transformers + peft, and the prefix cache never
serves one adapter's KV to another (nor an old adapter's KV to a name reloaded with other
weights), in the pool and in HiCache's host and file tiers.

The tiny random model borrows the default model's tokenizer files; prompts go in as token ids.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from model_harness import build_hf_model, random_ids, save_hf_model, tiny_config
from test_lora import hf_greedy, make_adapter

import radixgen
from radixgen.errors import InvalidRequestError
from radixgen.runtime.model_loader.resolve import resolve_model_path

pytestmark = pytest.mark.slow  # starts an Engine (real processes)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
N = 8


def base_model(tmp_path: Path) -> tuple[Any, Path]:
    """The tiny random Llama (HF) and its saved folder, with the default model's tokenizer."""
    base = build_hf_model(tiny_config("llama_gqa"), seed=3)
    folder = save_hf_model(base, tmp_path / "base")
    default = Path(resolve_model_path(None))
    for name in _TOKENIZER_FILES:
        if (default / name).exists():
            shutil.copy(default / name, folder / name)
    return base, folder


def test_engine_serves_adapters_per_request(tmp_path: Path) -> None:
    base, folder = base_model(tmp_path)
    peft = {}
    paths = []
    for i, name in enumerate(("a", "b", "c")):
        peft[name], path = make_adapter(base, tmp_path / name, seed=i, rank=4 + 4 * i)
        paths.append(f"{name}={path}")
    prompt = random_ids(20, seed=5)
    other = random_ids(18, seed=6)
    params = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}
    loras: list[str | None] = ["a", "b", None, "c"]
    want = [hf_greedy(base if n is None else peft[n], prompt, N)[0] for n in loras]
    assert len({tuple(w) for w in want}) == 4  # every adapter changes the output
    with radixgen.Engine(
        str(folder),
        dtype="float32",
        grammar_backend="none",
        max_total_tokens=4096,
        log_level="warning",
        lora_paths=paths,
        max_loras_per_batch=2,  # three adapters: one waits for a slot
    ) as engine:
        outs = engine.generate(input_ids=[prompt] * 4, sampling_params=params, lora_path=loras)
        assert isinstance(outs, list)
        assert [o["output_ids"] for o in outs] == want
        again = engine.generate(input_ids=prompt, sampling_params=params, lora_path="b")
        assert isinstance(again, dict)
        assert again["output_ids"] == want[1]
        assert again["meta_info"]["cached_tokens"] >= 16  # the same adapter shares its prefix
        first = engine.generate(input_ids=other, sampling_params=params, lora_path="a")
        cross = engine.generate(input_ids=other, sampling_params=params, lora_path="c")
        assert isinstance(first, dict) and isinstance(cross, dict)
        assert cross["meta_info"]["cached_tokens"] == 0  # a's prefix is not served to c
        assert cross["output_ids"] == hf_greedy(peft["c"], other, N)[0]
        with pytest.raises(InvalidRequestError, match="LoRA adapter 'zz' is not loaded"):
            engine.generate(input_ids=prompt, sampling_params=params, lora_path="zz")
        # unloading while a request of the adapter runs: it finishes under the adapter first
        long = {**params, "max_new_tokens": 64}
        stream = engine.generate(input_ids=prompt, sampling_params=long, lora_path="a", stream=True)
        assert not isinstance(stream, (dict, list))
        first_chunk = next(stream)
        assert engine.unload_lora_adapter("a")["success"]
        with pytest.raises(InvalidRequestError, match="LoRA adapter 'a' is not loaded"):
            engine.generate(input_ids=prompt, sampling_params=params, lora_path="a")
        *_, last = [first_chunk, *stream]
        assert last["output_ids"][:N] == want[0]
        assert len(last["output_ids"]) == 64
        assert engine.load_lora_adapter("a", paths[0].split("=", 1)[1])["success"]
        again = engine.generate(input_ids=other, sampling_params=params, lora_path="a")
        assert isinstance(again, dict) and again["output_ids"] == first["output_ids"]
        # the name now holds other weights: the prefix cached under the old ones is not served
        # (the cache's namespace is the adapter's content: c's prefix of `other` is its own)
        assert engine.unload_lora_adapter("a")["success"]
        assert engine.load_lora_adapter("a", paths[2].split("=", 1)[1])["success"]
        swapped = engine.generate(input_ids=other, sampling_params=params, lora_path="a")
        assert isinstance(swapped, dict) and swapped["output_ids"] == cross["output_ids"]
        assert swapped["meta_info"]["cached_tokens"] >= 16  # what c computed, shared


def test_a_missing_adapter_fails_before_any_process_starts(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"holds no adapter_config\.json"):
        radixgen.Engine(lora_paths=[f"x={tmp_path / 'nowhere'}"], log_level="warning")


def test_hicache_tiers_keep_each_adapters_blocks_apart_and_across_a_restart(
    tmp_path: Path,
) -> None:
    """A prompt computed under adapter a, evicted from the pool, comes back from the host tier
    for a only: under b or the base the same tokens are computed afresh (and equal peft). After
    a restart on the same file directory, a (loaded again from its folder) is served from disk."""
    base, folder = base_model(tmp_path)
    peft, paths = {}, {}
    for i, name in enumerate(("a", "b")):
        peft[name], paths[name] = make_adapter(base, tmp_path / name, seed=10 + i, rank=8)
    prompt, other = random_ids(48, seed=7), random_ids(48, seed=8)
    params = {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}
    want = {n: hf_greedy(peft[n], prompt, N)[0] for n in peft}
    want[None] = hf_greedy(base, prompt, N)[0]
    assert len({tuple(w) for w in want.values()}) == 3
    tiers = dict(
        dtype="float32",
        grammar_backend="none",
        max_total_tokens=96,  # one 48-token prompt and its answer, not two
        log_level="warning",
        debug_invariants=True,
        enable_hierarchical_cache=True,
        hicache_storage_backend="file",
        hicache_file_dir=str(tmp_path / "kv"),
        lora_paths=[f"{n}={p}" for n, p in paths.items()],
    )

    def gen(engine: radixgen.Engine, ids: list[int], lora: str | None) -> tuple[list[int], Any]:
        out = engine.generate(input_ids=ids, sampling_params=params, lora_path=lora)
        assert isinstance(out, dict)
        return out["output_ids"], out["meta_info"]["cached_tokens_details"]

    with radixgen.Engine(str(folder), **tiers) as engine:
        got, cached = gen(engine, prompt, "a")
        assert got == want["a"] and sum(cached.values()) == 0
        gen(engine, other, None)  # evicts a's prompt from the pool to the host tier
        for lora in ("b", None):  # the same tokens, other weights: nothing to reuse
            got, cached = gen(engine, prompt, lora)
            assert got == want[lora] and sum(cached.values()) == 0, (lora, cached)
            gen(engine, other, None)
        got, cached = gen(engine, prompt, "a")
        assert got == want["a"] and cached["host"] >= 32, cached
    with radixgen.Engine(str(folder), **{**tiers, "lora_paths": [f"a={paths['a']}"]}) as engine:
        got, cached = gen(engine, prompt, "a")
        assert got == want["a"] and cached["storage"] >= 32, cached
