#!/usr/bin/env bash
# One device call on the H200: the first sampler call of fresh processes (scripts/gpu/first_call_profile.py)
# with the CPU-built bundle in .carry/sweep/ served three ways: plain TRITON_CACHE_DIR, through
# `kernelcache env` (the install's kept triton_key()), and a plain warm Triton cache. Results under $OUT.
# Run from the repo root with carry [".carry"] (scripts/gpu/prepare_carry.sh makes the vLLM tree).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=/tmp/kcf; rm -rf $T; mkdir -p $T
python3 -c "import tarfile; tarfile.open('.carry/vllm-h200.tar.xz').extractall('$T/vx', filter='fully_trusted')"
export PYTHONPATH=$PWD/scripts/gpu/site:$PWD:$T/vx/site:$T/vx/vllm PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"; } > $OUT/env.txt 2>&1
bundle=$(ls .carry/sweep/*.tar.zst | head -1)
echo "$bundle" >> $OUT/env.txt
timeout ${PROFILE_TIMEOUT:-540} python3 scripts/gpu/first_call_profile.py --bundle "$bundle" --vocab ${VOCAB:-128256} \
  --runs ${RUNS:-3} --out $OUT/first-call.json > $OUT/first-call.log 2>&1
echo "profile rc=$?"
tail -40 $OUT/first-call.log
