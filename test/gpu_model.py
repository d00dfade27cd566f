"""A model folder of the default model's shape with seeded random weights, for the GPU tests.

The bundled GGUF (93 MB) cannot travel to the lent GPU machine (64 MiB a call), so its config,
tokenizer and chat template travel instead (`.gpu_model/`, made by scripts/prepare_gpu_carry.sh)
and the weights are drawn here. On a CPU machine the converted default model folder serves as
the template. Weights are scaled so that the logits are decisive (few near-ties at the top) and
the model is well conditioned: small q/k projections keep attention scores near 1, so a bf16
rounding stays a small change of the logits. (With q/k at std 0.1, attention was so peaked that
transformers' own bf16 run of the model disagreed with its float32 run on the first token of 15
of test_gpu_engine's 16 prompts, at top-2 gaps up to 11.5: a greedy parity test on such a model
compares noise. At 0.02: none of the 16.)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
TEMPLATE_ENV = "RADIXGEN_GPU_MODEL_TEMPLATE"


def template_folder() -> Path:
    """Where config + tokenizer come from: $RADIXGEN_GPU_MODEL_TEMPLATE, the carried
    `.gpu_model/`, or the converted bundled model."""
    for candidate in (os.environ.get(TEMPLATE_ENV), ROOT / ".gpu_model"):
        if candidate and (Path(candidate) / "config.json").exists():
            return Path(candidate)
    from radixgen.runtime.model_loader import resolve_model_path

    return Path(resolve_model_path(None))


def copy_template(dest: Path) -> Path:
    """Copy the template's config, tokenizer and chat template (no weights) into `dest`."""
    src = template_folder()
    dest.mkdir(parents=True, exist_ok=True)
    for name in TEMPLATE_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dest / name)
    return dest


def random_default_shape_folder(dest: Path, seed: int = 0) -> Path:
    """`dest` with the template's files and seeded random bf16 weights (HF Llama names)."""
    import json

    from safetensors.torch import save_file

    copy_template(dest)
    cfg = json.loads((dest / "config.json").read_text())
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to(torch.bfloat16)

    def norm() -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(h, generator=gen)).to(torch.bfloat16)

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": draw(cfg["vocab_size"], h, std=0.4)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = draw(heads * d, h, std=0.02)
        w[p + "self_attn.k_proj.weight"] = draw(kv_heads * d, h, std=0.02)
        w[p + "self_attn.v_proj.weight"] = draw(kv_heads * d, h, std=h**-0.5)
        w[p + "self_attn.o_proj.weight"] = draw(h, heads * d, std=(heads * d) ** -0.5)
        w[p + "mlp.gate_proj.weight"] = draw(inter, h, std=h**-0.5)
        w[p + "mlp.up_proj.weight"] = draw(inter, h, std=h**-0.5)
        w[p + "mlp.down_proj.weight"] = draw(h, inter, std=inter**-0.5)
        w[p + "input_layernorm.weight"] = norm()
        w[p + "post_attention_layernorm.weight"] = norm()
    w["model.norm.weight"] = norm()
    if not cfg.get("tie_word_embeddings", False):
        w["lm_head.weight"] = draw(cfg["vocab_size"], h, std=h**-0.5)
    save_file(w, str(dest / "model.safetensors"))
    return dest
