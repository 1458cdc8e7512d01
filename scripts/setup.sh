#!/usr/bin/env bash
# Create .venv with everything kernelcache's build and tests need on a CPU-only machine.
# Idempotent: re-running only installs what is missing. Override the interpreter with PYTHON=.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TRITON_VERSION=${TRITON_VERSION:-3.6.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }
pip install --upgrade pip >/dev/null
# The serving stack (the user's in production): CPU torch and Triton, which cross-compiles for any NVIDIA arch.
pip install "torch==$TORCH_VERSION" "triton==$TRITON_VERSION"
pip install -e ".[test]"

# FlashInfer (vLLM 0.33 pins 0.7.2.post1) and the pip CUDA 13.0 toolchain that builds its sampling module.
# Opt-in (scripts/test.sh turns it on). flashinfer-python goes in with --no-deps plus only what
# `import flashinfer.sampling` needs, so pip never swaps the torch above for a CUDA one. The CUDA wheels go
# into a directory of their own (kernelcache/exercise/flashinfer.py: setup_toolchain), through pip's cache.
if [ "${KERNELCACHE_SETUP_FLASHINFER:-0}" = 1 ]; then
  FLASHINFER_VERSION=${FLASHINFER_VERSION:-0.7.2.post1}
  pip install --no-deps "flashinfer-python==$FLASHINFER_VERSION" "apache-tvm-ffi==0.1.11" \
    numpy nvidia-ml-py tqdm requests urllib3 idna certifi charset-normalizer
  "$VENV/bin/python" -c "from kernelcache.exercise.flashinfer import setup_toolchain; setup_toolchain()"
fi
