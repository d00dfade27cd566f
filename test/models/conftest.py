"""Model tests run torch on one thread: the models are tiny (dispatch-bound), and two OpenMP
threads on a shared 2-core machine spin against other work (10x slower wall time)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
