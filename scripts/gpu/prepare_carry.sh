#!/usr/bin/env bash
# Prepare what a GPU run on the H200 (Python 3.12, torch 2.11, triton 3.6, no vLLM, no network) must carry:
# vLLM 0.33.0's pure-Python tree (every .so, vllm-rs and C/C++ source stripped) plus the cp312 wheels its
# sampler (and the gated-delta-net layer) imports that the image lacks, and zstandard for kernelcache.
# Output: .carry/vllm-h200.tar.xz (git-ignored), about 18 MB. VLLM_VERSION picks another release's tree,
# VLLM_TREE_FROM takes it from an installed venv's site-packages (the wheel's files as they are) instead of the
# index, CARRY_FILE writes elsewhere (scripts/gpu/prepare_release_carry.sh: .carry/rel34/vllm-h200.tar.xz).
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${VLLM_VERSION:-0.33.0}
carry_file=${CARRY_FILE:-.carry/vllm-h200.tar.xz}
mkdir -p "$(dirname "$carry_file")"; work=$(mktemp -d)
PY=${PY:-.venv/bin/python}
mkdir -p "$work/tree/vllm"
if [ -n "${VLLM_TREE_FROM:-}" ]; then
  cp -a "$VLLM_TREE_FROM/vllm" "$VLLM_TREE_FROM/vllm-$version.dist-info" "$work/tree/vllm/"
  find "$work/tree/vllm" -name __pycache__ -prune -exec rm -rf {} +
else
  $PY -m pip download -q --no-deps "vllm==$version" -d "$work/dl"
  (cd "$work/tree/vllm" && unzip -q "$work"/dl/vllm-"$version"-*.whl)
fi
find "$work/tree/vllm" \( -name '*.so' -o -name '*.so.*' -o -name '*.h' -o -name '*.hpp' -o -name '*.cuh' -o -name '*.inl' \
  -o -name '*.cu' -o -name '*.cpp' -o -name '*.c' \) -delete
rm -f "$work/tree/vllm/vllm/vllm-rs"
wheels=(pyzmq==27.3.0 cbor2==6.3.0 msgspec==0.23.0 pybase64==1.5.1 cachetools==8.0.2 pydantic==2.14.4
  pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 openai==2.54.0
  jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 openai-harmony==0.0.8 fastapi==0.136.3 starlette==1.10.0
  partial-json-parser==0.2.1.1.post7 xgrammar==0.2.8 apache-tvm-ffi==0.1.11 llguidance==1.7.6 zstandard==0.25.0
  einops==0.8.2 compressed-tensors==0.17.0 loguru==0.7.3)  # the last three: the gated-delta-net layer's imports
plats=(--platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
  --platform manylinux_2_35_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plats[@]}" \
  -d "$work/wheels" "${wheels[@]}"
$PY -m pip install -q --no-deps --no-compile --target "$work/tree/site" "$work"/wheels/*.whl \
  --python-version 3.12 --implementation cp --only-binary=:all: "${plats[@]}"
tar -C "$work/tree" -cJf "$carry_file" vllm site
ls -la "$carry_file"
rm -rf "$work"
