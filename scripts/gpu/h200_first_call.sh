#!/usr/bin/env bash
# One device call on the H200: the first sampler call of fresh processes (scripts/gpu/first_call_profile.py)
# with the CPU-built bundle in .carry/sweep/ served three ways: plain TRITON_CACHE_DIR, through
# `kernelcache env` (the install's kept triton_key()), and a plain warm Triton cache. Results under $OUT.
# Run from the repo root with carry [".carry"] (scripts/gpu/prepare_carry.sh makes the vLLM tree).
set -uo pipefail
source scripts/gpu/harness.sh /tmp/kcf
bundle=$(ls .carry/sweep/*.tar.zst | head -1)
echo "$bundle" >> $OUT/env.txt
timeout ${PROFILE_TIMEOUT:-540} python3 scripts/gpu/first_call_profile.py --bundle "$bundle" --vocab ${VOCAB:-128256} \
  --runs ${RUNS:-3} --out $OUT/first-call.json > $OUT/first-call.log 2>&1
echo "profile rc=$?"
tail -40 $OUT/first-call.log
