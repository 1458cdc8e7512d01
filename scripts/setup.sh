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
