#!/usr/bin/env bash
# Set up the serving stack (scripts/setup.sh: .venv, vLLM 0.33.0's own torch, Triton and FlashInfer, so the
# bundle installs in a plain `pip install vllm==0.33.0` environment or vLLM's image), then the main job: a real
# cross build for a serve command (SERVE, default `vllm serve Qwen/Qwen3-8B`: the installed vLLM configures it as
# a server on the GPU would, and every family the model needs is built: the sampler paths, FlashInfer's module,
# whose CUDA toolchain the build fetches on first use, Model Runner V2) for an H200 (sm_90, 132 SMs) on this
# CPU-only machine, then `inspect` and `verify` of the bundle.
# Override with ARCH=sm_100 GPU=b200 SERVE="vllm serve /path/to/model --max-model-len 32768", or pass extra
# `kernelcache build` flags as arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=serving KERNELCACHE_SETUP_DEV=0 bash scripts/setup.sh
ARCH=${ARCH:-sm_90}; GPU=${GPU:-h200}; SERVE=${SERVE:-vllm serve Qwen/Qwen3-8B}
# shellcheck disable=SC2086  # SERVE is the serve command's words
.venv/bin/kernelcache build --arch "$ARCH" --gpu "$GPU" -o bundles "$@" -- $SERVE
bundle=$(ls -t bundles/*-"$ARCH"-"$GPU".tar.zst | head -1)
.venv/bin/kernelcache inspect "$bundle"
.venv/bin/kernelcache verify "$bundle"
