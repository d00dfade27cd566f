"""CUDA-graph decode on the CPU side: captured sizes from the flags, the bucket a batch replays,
the padded static inputs, the flags themselves, and that a CPU runner never builds graphs.

The graphs themselves run in test_cuda_graphs.py (gpu).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_harness import build_hf_model, save_hf_model, tiny_config

from radixgen.cli import build_parser
from radixgen.errors import InvalidRequestError
from radixgen.runtime.model_executor.cuda_graph_runner import (
    PAD_KV_SLOT,
    PAD_REQ_ROW,
    PAD_SEQ_LEN,
    StaticDecodeInputs,
    bucket_for,
    capture_batch_sizes,
    decode_batch_of,
    fill_static_inputs,
    runs_in_graph,
)
from radixgen.runtime.model_executor.forward_batch import ForwardBatch
from radixgen.runtime.model_executor.model_runner import ModelRunner
from radixgen.server_args import ServerArgs, field_help, from_cli_namespace
from radixgen.sglang_flag_table import IMPLEMENTED
from radixgen.sglang_flags import FOREIGN_FLAGS, markdown_table

SGLANG_TO_256 = [1, 2, 4, 8, 12, *range(16, 257, 8)]


# --- captured sizes and buckets ----------------------------------------------------------------


def test_default_buckets_are_sglangs_up_to_256():
    sizes = capture_batch_sizes(256, None, max_running_requests=1024)
    assert sizes == SGLANG_TO_256
    assert len(sizes) == 36 and sizes[:7] == [1, 2, 4, 8, 12, 16, 24]


def test_buckets_past_256_step_by_16_then_32():
    sizes = capture_batch_sizes(1024, None, max_running_requests=4096)
    assert sizes[:36] == SGLANG_TO_256
    assert sizes[36:52] == list(range(272, 513, 16))
    assert sizes[52:] == list(range(544, 1025, 32))


@pytest.mark.parametrize(
    ("max_bs", "max_running", "last_two"),
    [(256, 128, [120, 128]), (256, 100, [96, 100]), (50, 128, [48, 50]), (3, 128, [2, 3])],
)
def test_buckets_are_capped_by_max_bs_and_running_requests(max_bs, max_running, last_two):
    sizes = capture_batch_sizes(max_bs, None, max_running)
    assert sizes[-2:] == last_two
    assert sizes == sorted(set(sizes)) and sizes[0] == 1


def test_explicit_sizes_replace_the_list():
    assert capture_batch_sizes(256, [8, 1, 4, 4, 300], 256) == [1, 4, 8]
    assert capture_batch_sizes(2, [1, 16, 64], 1024) == [1, 16, 64]  # max-bs does not cap them


@pytest.mark.parametrize(
    ("n", "bucket"), [(1, 1), (3, 4), (5, 8), (8, 8), (13, 16), (17, 24), (256, 256), (257, None)]
)
def test_a_batch_replays_the_smallest_bucket_that_holds_it(n, bucket):
    assert bucket_for(n, SGLANG_TO_256) == bucket


# --- static inputs -----------------------------------------------------------------------------


def _longs(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def test_static_inputs_hold_the_rows_then_padding():
    static = StaticDecodeInputs.allocate(8, "cpu")
    assert static.req_rows.dtype == torch.int32 and static.seq_lens.dtype == torch.int32
    lens = fill_static_inputs(
        static, 8, _longs([9] * 8), _longs([99] * 8), _longs([77] * 8), [5] * 8, [44] * 8
    )  # an earlier, bigger step leaves stale rows behind
    assert lens == [44] * 8
    lens = fill_static_inputs(
        static, 4, _longs([11, 12, 13]), _longs([3, 7, 20]), _longs([40, 41, 42]), [2, 6, 1],
        [4, 8, 21],
    )  # fmt: skip
    assert lens == [4, 8, 21, PAD_SEQ_LEN]
    assert static.input_ids[:4].tolist() == [11, 12, 13, 0]
    assert static.positions[:4].tolist() == [3, 7, 20, 0]
    assert static.out_cache_loc[:4].tolist() == [40, 41, 42, PAD_KV_SLOT]
    assert static.req_rows[:4].tolist() == [2, 6, 1, PAD_REQ_ROW]
    assert static.seq_lens[:4].tolist() == [4, 8, 21, PAD_SEQ_LEN]
    # padding is a valid 1-token decode: position 0 of request slot 0, writing KV slot 0
    assert PAD_SEQ_LEN == 1 and PAD_REQ_ROW == 0 and PAD_KV_SLOT == 0


def test_static_inputs_refuse_more_rows_than_the_bucket():
    static = StaticDecodeInputs.allocate(4, "cpu")
    with pytest.raises(AssertionError):
        fill_static_inputs(static, 2, _longs([1] * 3), _longs([1] * 3), _longs([1] * 3),
                           [0] * 3, [1] * 3)  # fmt: skip
    with pytest.raises(AssertionError):
        fill_static_inputs(static, 5, _longs([1]), _longs([1]), _longs([1]), [0], [1])


def test_a_graph_batch_is_views_of_the_static_buffers():
    static = StaticDecodeInputs.allocate(16, "cpu")
    batch = decode_batch_of(static, 4)
    assert batch.is_decode_only and batch.batch_size == 4 and batch.logits_indices is None
    for view, buf in (
        (batch.input_ids, static.input_ids),
        (batch.positions, static.positions),
        (batch.out_cache_loc, static.out_cache_loc),
    ):
        assert view.shape == (4,) and view.data_ptr() == buf.data_ptr()
    assert static.seq_lens[:4].is_contiguous() and static.req_rows[:4].is_contiguous()


def _batch(extend_lens: list[int], logits: list[int] | None) -> ForwardBatch:
    n = sum(extend_lens)
    return ForwardBatch(
        _longs([1] * n), _longs([0] * n), _longs([1] * n), list(range(len(extend_lens))),
        [3] * len(extend_lens), extend_lens, [sum(extend_lens[:i]) for i in range(len(extend_lens))],
        None if logits is None else _longs(logits),
    )  # fmt: skip


def test_only_whole_decode_batches_run_in_graphs():
    assert runs_in_graph(_batch([1, 1, 1], None), max_bs=4)
    assert runs_in_graph(_batch([1, 1, 1], [0, 1, 2]), max_bs=4)
    assert not runs_in_graph(_batch([1, 1, 1, 1, 1], None), max_bs=4)  # past the largest graph
    assert not runs_in_graph(_batch([1, 5], [0, 5]), max_bs=4)  # a prefill chunk rides along
    assert not runs_in_graph(_batch([1, 1, 1], [0, 2]), max_bs=4)  # a row without logits
    assert not runs_in_graph(_batch([1, 1], [0, 0]), max_bs=4)  # a row asked twice
    assert not runs_in_graph(_batch([], None), max_bs=4)


# --- flags -------------------------------------------------------------------------------------


def test_graph_flags_parse_into_their_fields():
    ns = build_parser().parse_args(
        ["serve", "--disable-cuda-graph", "--cuda-graph-max-bs", "64", "--cuda-graph-bs", "1", "8"]
    )
    graphs = from_cli_namespace(ns).cuda_graph
    assert graphs.disable_cuda_graph and graphs.cuda_graph_max_bs == 64
    assert graphs.cuda_graph_bs == (1, 8)
    defaults = ServerArgs().cuda_graph
    assert not defaults.disable_cuda_graph and defaults.cuda_graph_max_bs == 256
    assert defaults.cuda_graph_bs is None
    assert ServerArgs.from_kwargs(cuda_graph_bs=[4, 2]).cuda_graph.cuda_graph_bs == (4, 2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"cuda_graph_max_bs": 0}, "cuda_graph_max_bs"), ({"cuda_graph_bs": [1, 0]}, "cuda_graph_bs")],
)
def test_bad_graph_sizes_are_refused(kwargs, field):
    with pytest.raises(InvalidRequestError, match=field):
        ServerArgs.from_kwargs(**kwargs)


def test_graph_flags_are_implemented_in_the_flag_table():
    foreign = {n for f in FOREIGN_FLAGS for n in f.names}
    doc = markdown_table(field_help())
    for flag in ("disable-cuda-graph", "cuda-graph-max-bs", "cuda-graph-bs"):
        assert flag in IMPLEMENTED and flag not in foreign
        assert f"| `--{flag}` | implemented |" in doc
    assert "| `--cuda-graph-bs-decode` | accepted, no effect |" in doc


# --- CPU runner --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_hf_model(tiny_config("llama_gqa"), seed=3)
    return save_hf_model(model, tmp_path_factory.mktemp("graphs_cpu"))


def test_a_cpu_runner_never_builds_graphs(tiny_folder: Path):
    """On CPU the graph flags change nothing: no runner, the step runs as before."""
    args = ServerArgs.from_kwargs(
        dtype="float32", max_total_tokens=256, cuda_graph_bs=[1, 2], cuda_graph_max_bs=2
    )
    runner = ModelRunner(str(tiny_folder), args, context_length=64)
    assert runner.graph_runner is None
    slots = runner.kv_pool.alloc(3)
    assert slots is not None
    row = runner.req_to_token_pool.alloc()
    assert row is not None
    runner.req_to_token_pool.write_row(row, 0, slots)
    batch = ForwardBatch(_longs([5, 6, 7]), _longs([0, 1, 2]), slots, [row], [0], [3], [0], None)
    assert runner.forward(batch).rows_float(slice(None)).shape == (3, 512)
