"""`--device`: auto picks CUDA only where it is visible, and cuda without a device is refused
with a message naming the flag (a CPU test: the GPU machine has a device)."""

from __future__ import annotations

import pytest
import torch

from radixgen.errors import InvalidRequestError
from radixgen.runtime.model_executor.resolution import resolve_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def test_auto_is_cpu_without_cuda():
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"


def test_cuda_without_a_device_is_refused_precisely():
    with pytest.raises(InvalidRequestError) as err:
        resolve_device("cuda")
    assert "--device cuda" in str(err.value) and "no CUDA device" in str(err.value)
    assert err.value.param == "device"


def test_auto_gives_flashinfer_only_the_models_it_serves():
    """`--attention-backend auto` on CUDA takes flashinfer only for bf16/fp16 models with a head
    dim it is built for and no sliding-window layers (else triton)."""
    from dataclasses import replace

    from radixgen.runtime.model_executor.resolution import flashinfer_serves
    from radixgen.runtime.models.model_config import ModelArchConfig

    cfg = ModelArchConfig.from_dict(
        {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
         "num_hidden_layers": 2, "num_attention_heads": 9, "num_key_value_heads": 3,
         "vocab_size": 1000}
    )  # fmt: skip
    assert cfg.head_dim == 64
    assert flashinfer_serves(cfg, torch.bfloat16) and flashinfer_serves(cfg, torch.float16)
    assert not flashinfer_serves(cfg, torch.float32)
    assert not flashinfer_serves(replace(cfg, head_dim=16), torch.bfloat16)
    windowed = replace(cfg, layer_sliding_windows=(None, 4096))
    assert not flashinfer_serves(windowed, torch.bfloat16)


def test_float32_rows_are_copies_the_sampler_may_modify():
    """Logits read through a slice are fresh tensors even in float32 (the sampler writes them in
    place; on CUDA the logits are a graph's inference-mode output)."""
    from radixgen.runtime.model_executor.logits_output import LogitsOutput

    with torch.inference_mode():
        raw = torch.randn(4, 10)
    out = LogitsOutput(raw, torch.empty(0), torch.empty(0), 10, None)
    rows = out.rows_float(slice(0, 4))
    rows.add_(1.0)  # would raise on a view of an inference tensor
    assert rows.data_ptr() != raw.data_ptr()
