"""`--device`: auto picks CUDA only where it is visible, and cuda without a device is refused
with a message naming the flag (a CPU test: the GPU machine has a device)."""

from __future__ import annotations

import pytest
import torch

from radixgen.errors import InvalidRequestError
from radixgen.runtime.model_executor.model_runner import resolve_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def test_auto_is_cpu_without_cuda():
    assert resolve_device("auto") == "cpu"
    assert resolve_device("cpu") == "cpu"


def test_cuda_without_a_device_is_refused_precisely():
    with pytest.raises(InvalidRequestError) as err:
        resolve_device("cuda")
    assert "--device cuda" in str(err.value) and "no CUDA device" in str(err.value)
    assert err.value.param == "device"
