"""A model folder of the default model's shape with seeded random weights, for machines the
bundled model cannot travel to (the GPU machine): config.json, bf16 safetensors, and a
word-level tokenizer.json of the same vocabulary size (benchmarks drive the engine with ids).

    python benchmark/random_model.py OUT_DIR [--tiny] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# SmolLM2-135M's shape (the default model, 134.5 M parameters)
DEFAULT_SHAPE: dict[str, Any] = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
# the same layout in miniature, for dry runs on CPU
TINY_SHAPE: dict[str, Any] = {
    **DEFAULT_SHAPE,
    "vocab_size": 512,
    "hidden_size": 96,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
}
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 as in SmolLM2


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer: ids 0-2 are SmolLM2's special tokens, id i >= 3 is the word `t<i>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({f"t{i}": i for i in range(len(SPECIAL), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL))
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": SPECIAL[1], "eos_token": SPECIAL[2], "model_max_length": 2048}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def build_random_model(folder: str | Path, seed: int = 0, tiny: bool = False) -> Path:
    """Write the folder (once: an existing complete folder is reused) and return its path.

    Weights: transformers' own initialisation of a seeded `LlamaConfig`, saved in bfloat16."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    out = Path(folder)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    shape = TINY_SHAPE if tiny else DEFAULT_SHAPE
    config = LlamaConfig(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    write_tokenizer(out, shape["vocab_size"])
    return out


def random_prompts(n: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """n prompts of `length` ordinary token ids, distinct from their first token on (nothing is
    shared through the prefix cache unless a caller prepends a common prefix)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(len(SPECIAL), vocab_size, (n, length), generator=gen)
    ids[:, 0] = len(SPECIAL) + torch.randperm(vocab_size - len(SPECIAL), generator=gen)[:n]
    return ids.tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--tiny", action="store_true", help="the miniature shape (CPU dry runs)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(build_random_model(args.out_dir, args.seed, args.tiny))
    return 0


if __name__ == "__main__":
    sys.exit(main())
