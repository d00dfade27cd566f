"""LoRA adapters on our ModelRunner against Hugging Face transformers + peft (unmerged and
merged), float32.

Tiny random Llama, Qwen2, Qwen3, Mistral, Phi-3 and Gemma 2 models and random PEFT adapters on
q/k/v/o/gate/up/down (B drawn nonzero, so every adapter changes the outputs) are built in code and
saved like real ones. Greedy tokens must equal peft's token for token; a mixed step of several
adapters and the base must equal each request run alone; adapters PEFT can write and we cannot
apply are refused by name.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from arch_harness import ARCH_VARIANTS, arch_config
from model_harness import (
    Session,
    build_hf_model,
    max_rel_err,
    random_ids,
    save_hf_model,
    tiny_config,
)
from peft import LoraConfig, PeftModel, get_peft_model

from radixgen.errors import InvalidRequestError
from radixgen.runtime.layers.linear import Linear
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.server_args import ServerArgs

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FP32_TOL = 1e-4
NEW_TOKENS = 10


def make_adapter(
    base: Any, folder: Path, seed: int, rank: int = 8, **config: Any
) -> tuple[Any, Path]:
    """A peft model over a fresh copy of `base` with every LoRA factor redrawn (nonzero B),
    saved to `folder`; returns (the peft model, folder)."""
    copy = build_hf_model(base.config, seed=0)
    copy.load_state_dict(base.state_dict())
    cfg = LoraConfig(
        r=rank,
        lora_alpha=config.pop("lora_alpha", 2 * rank),
        target_modules=config.pop("target_modules", ALL_TARGETS),
        lora_dropout=0.0,
        **config,
    )
    peft_model = get_peft_model(copy, cfg)
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    peft_model.save_pretrained(str(folder))
    return peft_model.eval(), folder


@torch.no_grad()
def hf_greedy(model: Any, prompt: Sequence[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation by full-sequence forwards, and the logits of each chosen step."""
    ids = list(prompt)
    rows = []
    for _ in range(n):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        rows.append(logits)
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :], torch.stack(rows)


def lora_runner(base_folder: Path, adapters: dict[str, Path], **kwargs: Any) -> ModelRunner:
    args = ServerArgs.from_kwargs(
        dtype="float32",
        max_total_tokens=4096,
        enable_lora=True,
        lora_paths=[f"{name}={path}" for name, path in adapters.items()],
        **kwargs,
    )
    return ModelRunner(str(base_folder), args, context_length=1000)


def greedy(
    session: Session, prompts: Sequence[Sequence[int]], loras: Sequence[str | None], n: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill every prompt in one step, then decode all of them together for n-1 steps."""
    reqs = [session.new_request() for _ in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    logits = session.step(list(zip(reqs, prompts, strict=True)), loras)
    for _ in range(n):
        for i, lg in enumerate(logits):
            rows[i].append(lg[-1])
            out[i].append(int(lg[-1].argmax()))
        if len(out[0]) == n:
            break
        logits = session.step([(r, [o[-1]]) for r, o in zip(reqs, out, strict=True)], loras)
    return out, [torch.stack(r) for r in rows]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny Llama, four random adapters (ranks 4, 8, 8 rsLoRA, 16 on a subset) and peft's
    models of each."""
    root = tmp_path_factory.mktemp("lora_llama")
    base = build_hf_model(tiny_config("llama_gqa"), seed=3)
    folder = save_hf_model(base, root / "base")
    specs: dict[str, dict[str, Any]] = {
        "a4": dict(rank=4),
        "b8": dict(rank=8),
        "c8rs": dict(rank=8, use_rslora=True),
        "d16": dict(rank=16, target_modules=["q_proj", "v_proj", "down_proj"]),
    }
    peft_models, paths = {}, {}
    for i, (name, spec) in enumerate(specs.items()):
        peft_models[name], paths[name] = make_adapter(base, root / name, seed=i, **spec)
    return dict(base=base, folder=folder, peft=peft_models, paths=paths, root=root)


def test_greedy_equals_peft_unmerged_llama(llama: dict[str, Any]) -> None:
    runner = lora_runner(llama["folder"], llama["paths"])
    prompt = random_ids(12, seed=5)
    base_tokens, _ = hf_greedy(llama["base"], prompt, NEW_TOKENS)
    for name, peft_model in llama["peft"].items():
        want, want_logits = hf_greedy(peft_model, prompt, NEW_TOKENS)
        assert want != base_tokens, f"adapter {name} does not change the greedy output"
        got, got_logits = greedy(Session(runner), [prompt], [name], NEW_TOKENS)
        assert got[0] == want, name
        assert max_rel_err(got_logits[0], want_logits) < FP32_TOL, name
        merged = PeftModel.from_pretrained(build_hf_model(llama["base"].config, seed=3),
                                           str(llama["paths"][name])).merge_and_unload()  # fmt: skip
        assert hf_greedy(merged, prompt, NEW_TOKENS)[0] == want, f"{name} merged"
    got, _ = greedy(Session(runner), [prompt], [None], NEW_TOKENS)
    assert got[0] == base_tokens


def test_mixed_batch_equals_each_alone(llama: dict[str, Any]) -> None:
    """4 adapters and the base in one step (an adapter's rows split by another's, so a group
    is gathered by index), against each request run alone."""
    runner = lora_runner(llama["folder"], llama["paths"])
    loras = ["a4", None, "b8", "a4", "c8rs", "d16"]
    prompts = [random_ids(5 + 3 * i, seed=20 + i) for i in range(len(loras))]
    mixed, mixed_logits = greedy(Session(runner), prompts, loras, NEW_TOKENS)
    for i, (prompt, name) in enumerate(zip(prompts, loras, strict=True)):
        alone, alone_logits = greedy(Session(runner), [prompt], [name], NEW_TOKENS)
        assert mixed[i] == alone[0], (i, name)
        assert max_rel_err(mixed_logits[i], alone_logits[0]) < FP32_TOL
        ref = llama["base"] if name is None else llama["peft"][name]
        assert mixed[i] == hf_greedy(ref, prompt, NEW_TOKENS)[0], (i, name)


def test_lru_swaps_adapters_through_two_slots(llama: dict[str, Any]) -> None:
    """Four adapters through two slots: each step swaps in what it needs, least recently used
    out, and outputs stay peft's."""
    runner = lora_runner(llama["folder"], llama["paths"], max_loras_per_batch=2)
    manager = runner.lora
    assert manager is not None
    prompt = random_ids(9, seed=7)
    for names in (["a4", "b8"], ["c8rs"], ["d16", "c8rs"], ["a4"]):
        got, _ = greedy(Session(runner), [prompt] * len(names), list(names), 3)
        for name, tokens in zip(names, got, strict=True):
            assert tokens == hf_greedy(llama["peft"][name], prompt, 3)[0], name
        assert set(names) <= set(manager.slot_of)
        assert len(manager.slot_of) <= 2
    # a4, b8 | c8rs over a4 | d16 over b8, then c8rs (the steps' order) | a4 over d16
    assert list(manager.slot_of) == ["c8rs", "a4"]


def test_no_lora_means_no_delta(llama: dict[str, Any]) -> None:
    """--enable-lora off: no manager, no linear layer carries a delta (the base path as before)."""
    args = ServerArgs.from_kwargs(dtype="float32", max_total_tokens=4096)
    runner = ModelRunner(str(llama["folder"]), args, context_length=1000)
    assert runner.lora is None
    assert all(m.delta is None for m in runner.model.modules() if isinstance(m, Linear))


def _edit_config(src: Path, dst: Path, **changes: Any) -> Path:
    dst.mkdir()
    (dst / "adapter_model.safetensors").write_bytes(
        (src / "adapter_model.safetensors").read_bytes()
    )
    raw = json.loads((src / "adapter_config.json").read_text())
    raw.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(raw))
    return dst


def test_refusals_name_the_reason(llama: dict[str, Any]) -> None:
    runner = lora_runner(llama["folder"], {}, max_lora_rank=8)
    manager = runner.lora
    assert manager is not None
    root, paths = llama["root"], llama["paths"]
    cases: dict[str, tuple[Path, str]] = {
        "dora": (_edit_config(paths["a4"], root / "dora", use_dora=True), "DoRA"),
        "save": (
            _edit_config(paths["a4"], root / "save", modules_to_save=["lm_head"]),
            "modules_to_save",
        ),
        "emb": (
            _edit_config(paths["a4"], root / "emb", target_modules=["q_proj", "embed_tokens"]),
            "embed_tokens",
        ),
        "big": (paths["d16"], "rank 16 is over --max-lora-rank 8"),
        "missing": (root / "nowhere", "is not a folder"),
    }
    other = build_hf_model(tiny_config("llama_gqa", hidden_size=32), seed=4)
    cases["shape"] = (make_adapter(other, root / "other", seed=9)[1], "shape mismatch")
    for name, (path, reason) in cases.items():
        with pytest.raises(InvalidRequestError, match=reason):
            manager.load(name, str(path))
        assert name not in manager
    manager.load("a4", str(paths["a4"]))
    with pytest.raises(InvalidRequestError, match="already loaded"):
        manager.load("a4", str(paths["a4"]))
    manager.unload("a4")
    with pytest.raises(InvalidRequestError, match="not loaded"):
        manager.unload("a4")


def test_qwen2_greedy_equals_peft(tmp_path: Path) -> None:
    """Qwen2 (q/k/v biases, tied embeddings): the adapter adds to the biased fused output."""
    base = build_hf_model(tiny_config("qwen2_tied"), seed=6)
    folder = save_hf_model(base, tmp_path / "base")
    peft_model, path = make_adapter(base, tmp_path / "ad", seed=11, rank=8)
    runner = lora_runner(folder, {"q": path})
    prompt = random_ids(10, seed=8)
    want, want_logits = hf_greedy(peft_model, prompt, NEW_TOKENS)
    assert want != hf_greedy(base, prompt, NEW_TOKENS)[0]
    got, got_logits = greedy(Session(runner), [prompt], ["q"], NEW_TOKENS)
    assert got[0] == want
    assert max_rel_err(got_logits[0], want_logits) < FP32_TOL
    merged = PeftModel.from_pretrained(build_hf_model(base.config, seed=6), str(path))
    assert hf_greedy(merged.merge_and_unload(), prompt, NEW_TOKENS)[0] == want


# PEFT names of each architecture's projections: Phi-3's checkpoints fuse q/k/v and gate/up
# themselves, so its adapters target the fused layers (whole shards here)
_ARCH_TARGETS = {
    "qwen3": ALL_TARGETS,
    "gemma2": ALL_TARGETS,
    "mistral": ALL_TARGETS,
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
}


@pytest.mark.parametrize("variant", sorted(_ARCH_TARGETS))
def test_other_architectures_equal_peft(tmp_path: Path, variant: str) -> None:
    """Qwen3 (the adapter adds before the per-head q/k norms), Gemma 2 (GeGLU, soft-capping),
    Mistral, and Phi-3's fused checkpoint names: greedy tokens and logits equal peft's."""
    config = arch_config(variant) if variant in ARCH_VARIANTS else tiny_config(variant)
    base = build_hf_model(config, seed=12)
    folder = save_hf_model(base, tmp_path / "base")
    peft_model, path = make_adapter(
        base, tmp_path / "ad", seed=13, rank=8, target_modules=_ARCH_TARGETS[variant]
    )
    runner = lora_runner(folder, {"x": path})
    prompt = random_ids(11, seed=14)
    want, want_logits = hf_greedy(peft_model, prompt, NEW_TOKENS)
    assert want != hf_greedy(base, prompt, NEW_TOKENS)[0]
    got, got_logits = greedy(Session(runner), [prompt, prompt], ["x", None], NEW_TOKENS)
    assert got[0] == want
    assert max_rel_err(got_logits[0], want_logits) < FP32_TOL
    assert got[1] == hf_greedy(base, prompt, NEW_TOKENS)[0]
    merged = PeftModel.from_pretrained(build_hf_model(config, seed=12), str(path))
    assert hf_greedy(merged.merge_and_unload(), prompt, NEW_TOKENS)[0] == want  # merged too


def test_bf16_native_path_close_to_peft(llama: dict[str, Any]) -> None:
    """bf16 on the native kernels (packed weights, float32 projections into rotary and the
    residual): the adapter's delta adds to the unrounded outputs. Adapter rows stay as close to
    peft's own bf16 forward as base rows to HF's (measured: 0.020 and 0.022; peft's bf16 is
    itself 0.097 from its float32, these adapters being large), sharing one step."""
    args = ServerArgs.from_kwargs(
        dtype="bfloat16",
        max_total_tokens=4096,
        lora_paths=[f"b8={llama['paths']['b8']}"],
    )
    runner = ModelRunner(str(llama["folder"]), args, context_length=1000)
    prompt = random_ids(12, seed=15)
    session = Session(runner)
    reqs = [session.new_request(), session.new_request()]
    logits = session.step([(reqs[0], prompt), (reqs[1], prompt)], ["b8", None])
    ids = torch.tensor([prompt])
    with torch.no_grad():
        want_lora = copy.deepcopy(llama["peft"]["b8"]).to(torch.bfloat16)(ids).logits[0].float()
        want_base = llama["base"](ids).logits[0].float()
    assert max_rel_err(logits[0], want_lora) < 0.05
    assert max_rel_err(logits[1], want_base) < 0.05
    assert max_rel_err(logits[0], want_base) > 0.5  # the adapter visibly changes the rows
