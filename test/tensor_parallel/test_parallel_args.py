"""Parallelism flags that cannot run together are refused before any process starts."""

from __future__ import annotations

import pytest

from radixgen.errors import InvalidRequestError
from radixgen.server_args import ServerArgs


@pytest.mark.parametrize(
    ("flags", "param", "needle"),
    [
        ({"tp_size": 0}, "tp_size", "tp_size must be >= 1"),
        ({"tp_size": 2, "dist_timeout": 0.5}, "dist_timeout", "dist_timeout must be >= 1"),
        ({"nnodes": 2, "node_rank": 2}, "node_rank", "node_rank must be in [0, nnodes)"),
        ({"tp_size": 2, "nnodes": 2}, "dist_init_addr", "needs --dist-init-addr host:port"),
        ({"tp_size": 3, "nnodes": 2, "dist_init_addr": "h:1"}, "nnodes", "must split evenly"),
        ({"tp_size": 2, "nnodes": 2, "dist_init_addr": "h:1", "dp_size": 2}, "dp_size",
         "behind the SGLang router"),
        ({"tp_size": 2, "dist_init_addr": "no-port"}, "dist_init_addr", "must be host:port"),
        ({"tp_size": 2, "enable_dp_attention": True}, "enable_dp_attention", "--dp-size N"),
        ({"tp_size": 2, "dp_size": 2, "enable_dp_attention": True, "nnodes": 2,
          "dist_init_addr": "h:1"}, "dp_size", "behind the SGLang router"),
        ({"tp_size": 2, "enable_overlap_schedule": True}, "enable_overlap_schedule", "in turn"),
        ({"tp_size": 2, "device": "cuda"}, "device", "CPU ranks over gloo"),
        ({"tp_size": 2, "quantization": "gguf"}, "quantization", "not served with --tp-size"),
        ({"tp_size": 2, "quantization": "int8"}, "quantization", "not served with --tp-size"),
    ],
)  # fmt: skip
def test_refused_combinations_name_the_flag(flags, param, needle):
    with pytest.raises(InvalidRequestError, match=None) as err:
        ServerArgs.from_kwargs(**flags)
    assert needle in str(err.value) and err.value.param == param


def test_accepted_combinations():
    ServerArgs.from_kwargs(tp_size=3, dist_timeout=5)
    ServerArgs.from_kwargs(tp_size=2, quantization="unquant")
    ServerArgs.from_kwargs(tp_size=2, dp_size=2, enable_dp_attention=True)
    two = ServerArgs.from_kwargs(tp_size=2, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:29500")
    assert two.parallel.node_rank == 1
