"""Finding, converting and reading model weights and tokenizers (no download at run time)."""

from radixgen.runtime.model_loader.resolve import resolve_model_path

__all__ = ["resolve_model_path"]
