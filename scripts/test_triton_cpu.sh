#!/usr/bin/env bash
# The Triton kernels' tests on CPU, under Triton's interpreter (a separate pytest run, so that
# the CPU suite itself never imports triton). On a CUDA machine the same tests run natively in
# the main suite. triton comes with xgrammar's dependencies; nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -p no:cacheprovider -m triton_interpret \
    test/kernels/test_triton_attention.py test/kernels/test_triton_fused_ops.py \
    test/kernels/test_triton_compile.py test/kernels/test_triton_graph_mode.py \
    test/models/test_triton_backend.py test/models/test_triton_fused_model.py \
    test/models/test_arch_triton.py "$@"
