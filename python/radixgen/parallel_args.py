"""Checks of the parallelism flags (`ParallelConfig`) against each other and the device.

Part of `ServerArgs.validate`: a combination that cannot run is refused with a precise error
before any process starts. Imported by every process; no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixgen.errors import InvalidRequestError

if TYPE_CHECKING:
    from radixgen.server_args import ParallelConfig


def check_parallel(par: ParallelConfig, device: str, overlap: bool) -> None:
    """tp / dp / DP attention / multi-node settings; `device`: --device, `overlap`:
    --enable-overlap-schedule."""
    if par.tp_size < 1:
        raise InvalidRequestError("tp_size must be >= 1", "tp_size")
    if par.dist_timeout < 1:
        raise InvalidRequestError("dist_timeout must be >= 1 (seconds)", "dist_timeout")
    if par.nnodes < 1 or not 0 <= par.node_rank < par.nnodes:
        raise InvalidRequestError(
            f"node_rank must be in [0, nnodes) (got {par.node_rank} of {par.nnodes})",
            "node_rank",
        )
    if par.nnodes > 1:
        if not par.dist_init_addr:
            raise InvalidRequestError(
                "--nnodes > 1 needs --dist-init-addr host:port (where the ranks meet)",
                "dist_init_addr",
            )
        if par.tp_size % par.nnodes:
            raise InvalidRequestError(
                f"--tp-size {par.tp_size} must split evenly over --nnodes {par.nnodes}",
                "nnodes",
            )
        if par.dp_size > 1 or par.enable_dp_attention:
            raise InvalidRequestError(
                "--dp-size > 1 with --nnodes > 1: run one server per machine behind the "
                "SGLang router instead",
                "dp_size",
            )
    if par.dist_init_addr is not None:
        host, _, port = par.dist_init_addr.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidRequestError(
                f"dist_init_addr must be host:port, got {par.dist_init_addr!r}",
                "dist_init_addr",
            )
    if par.enable_dp_attention and (par.tp_size < 2 or par.dp_size != par.tp_size):
        raise InvalidRequestError(
            "--enable-dp-attention needs --tp-size N > 1 and --dp-size N (one attention "
            f"replica per rank; got tp {par.tp_size}, dp {par.dp_size})",
            "enable_dp_attention",
        )
    if par.tp_size > 1 and overlap:
        raise InvalidRequestError(
            "--enable-overlap-schedule with --tp-size > 1: the ranks run each step in turn",
            "enable_overlap_schedule",
        )
    if par.tp_size > 1 and device == "cuda":
        raise InvalidRequestError(
            "--tp-size > 1 runs on CPU ranks over gloo (--device cpu)", "device"
        )
