"""Which model class serves each supported architecture (scheduler process).

Every class is a `CausalLM` subclass (same forward contract, weight loading and
prepacking); modules are imported only for the architecture being loaded.
"""

from __future__ import annotations

import importlib

from radixgen.runtime.models.causal_lm import CausalLM
from radixgen.runtime.models.model_config import ModelArchConfig

# model_type -> (module under radixgen.runtime.models, class name)
_MODELS: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("llama", "LlamaForCausalLM"),
    "qwen2": ("llama", "LlamaForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "mixtral": ("moe", "MixtralForCausalLM"),
    "qwen2_moe": ("moe", "Qwen2MoeForCausalLM"),
    "qwen3_moe": ("moe", "Qwen3MoeForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
}


def model_class(cfg: ModelArchConfig) -> type[CausalLM]:
    """The class for `cfg.model_type` (model_config.py has refused unknown ones already)."""
    module_name, class_name = _MODELS[cfg.model_type]
    module = importlib.import_module(f"radixgen.runtime.models.{module_name}")
    cls: type[CausalLM] = getattr(module, class_name)
    return cls
