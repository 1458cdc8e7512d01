#!/usr/bin/env bash
# Prepare the carry of scripts/gpu/h100_engine_compile.sh (issue 39): vLLM 0.33.0's pure-Python tree and the
# pure-Python/cp312 packages its engine-config and model path import that the device image (Python 3.12, torch
# 2.11, Triton 3.6, transformers, numpy; no vLLM) lacks, copied from the lab venv (.venv-lab: the same vLLM 0.33.0
# wheel, installed), every .so of vLLM itself, vllm-rs and C/C++/CUDA sources left out. The package list is what
# the engine-config, model and compile path imports from the lab venv beyond the image's torch/transformers stack.
# Output: .carry/c39/vllm-tree.tar.xz (git-ignored, about 25 MB).
set -euo pipefail
cd "$(dirname "$0")/../.."
site=${SITE:-.venv-lab/lib/python3.12/site-packages}
out=.carry/c39; mkdir -p "$out"; work=$(mktemp -d)
mkdir -p "$work/tree/vllm" "$work/tree/site"
cp -a "$site/vllm" "$site"/vllm-0.33.0.dist-info "$work/tree/vllm/"
find "$work/tree/vllm" \( -name '*.so' -o -name '*.so.*' -o -name '*.h' -o -name '*.hpp' -o -name '*.cuh' -o -name '*.inl' \
  -o -name '*.cu' -o -name '*.cpp' -o -name '*.c' -o -name '__pycache__' \) -prune -exec rm -rf {} +
rm -f "$work/tree/vllm/vllm/vllm-rs"
for p in zmq pyzmq.libs pyzmq-27.3.0.dist-info cbor2 cbor2-6.3.0.dist-info msgspec msgspec-0.23.0.dist-info pybase64 \
  pybase64-1.5.1.dist-info cachetools cachetools-8.0.3.dist-info pydantic pydantic-2.14.4.dist-info pydantic_core \
  pydantic_core-2.50.5.dist-info annotated_types annotated_types-0.8.0.dist-info typing_inspection \
  typing_inspection-0.4.5.dist-info typing_extensions.py typing_extensions-4.16.0.dist-info openai \
  openai-3.63.0.dist-info jiter jiter-0.19.0.dist-info sniffio sniffio-1.3.1.dist-info openai_harmony \
  openai_harmony-0.0.8.dist-info fastapi fastapi-0.136.3.dist-info starlette starlette-1.10.0.dist-info \
  partial_json_parser partial_json_parser-0.2.1.1.post7.dist-info xgrammar xgrammar-0.2.8.dist-info tvm_ffi \
  apache_tvm_ffi-0.1.11.dist-info llguidance llguidance-1.7.6.dist-info zstandard zstandard-0.25.0.dist-info einops \
  einops-0.8.2.dist-info compressed_tensors compressed_tensors-0.17.0.dist-info loguru loguru-0.7.3.dist-info \
  annotated_doc annotated_doc-0.0.7.dist-info httpx2 httpx2-2.17.0.dist-info httpcore2 httpcore2-2.17.0.dist-info h11 \
  h11-0.16.0.dist-info cloudpickle cloudpickle-3.1.3.dist-info cpuinfo py_cpuinfo-9.0.0.dist-info prometheus_client \
  prometheus_client-0.26.0.dist-info truststore truststore-0.10.5.dist-info uvloop uvloop-0.23.0.dist-info; do
  cp -a "$site/$p" "$work/tree/site/"
done
find "$work/tree/site" -name '__pycache__' -prune -exec rm -rf {} +
tar -C "$work/tree" -cJf "$out/vllm-tree.tar.xz" vllm site
ls -la "$out"
rm -rf "$work"
