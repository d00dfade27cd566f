"""A tiny random-weight Llama folder shaped for tensor-parallel splits (test helper).

8 q heads and 2 KV heads (tp=2 splits both, tp=4 replicates each KV head twice), vocabulary 1000
(padded to 1024 at tp=2, so the last rank holds padding rows), float32 weights drawn with a wide
spread so greedy choices are decisive, and a word-level tokenizer (id i >= 3 is the word `t<i>`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 1000
LM_HEAD_STD = 0.8  # logits spread wide: greedy choices are decisive (few near-ties)
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)


def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab.update({f"t{i}": i for i in range(len(SPECIAL), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL))
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": SPECIAL[1], "eos_token": SPECIAL[2], "model_max_length": 1024}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def build_tp_model(folder: Path, seed: int = 0, **overrides: object) -> Path:
    """Write the model folder (config, float32 safetensors, tokenizer) and return it."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(**{**SHAPE, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            scale = LM_HEAD_STD if name == "lm_head.weight" else 0.12
            p.copy_(1.0 + 0.2 * noise if "norm" in name else scale * noise)
    model.save_pretrained(str(folder), safe_serialization=True)
    _tokenizer(folder)
    return folder


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n, length), generator=gen).tolist()
