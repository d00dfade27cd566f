"""Shared command-line plumbing for the examples: which backend to run the program on."""

from __future__ import annotations

import argparse

import radixgen as rg


def add_backend_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="a running radixgen server")
    parser.add_argument("--engine", action="store_true", help="run an in-process Engine instead")


def connect(args: argparse.Namespace) -> None:
    """Make the chosen backend the default for every program of the example."""
    backend = rg.EngineBackend() if args.engine else rg.RuntimeEndpoint(args.url)
    rg.set_default_backend(backend)
