#!/usr/bin/env bash
# One device call on the H200: the first sampler call of fresh processes (scripts/gpu/first_call_profile.py)
# with a CPU-built bundle (BUNDLE, default: the one in .carry/sweep/) served in MODES (default: all three):
# plain TRITON_CACHE_DIR, through `kernelcache env` (the kept triton_key() and tool outputs), and a plain warm Triton cache.
# NO_FILE=1 hides file(1). Results under $OUT.
# Run from the repo root with carry [".carry"] (scripts/gpu/prepare_carry.sh makes the vLLM tree).
set -uo pipefail
source scripts/gpu/harness.sh /tmp/kcf
bundle=${BUNDLE:-$(ls .carry/sweep/*.tar.zst | head -1)}
echo "$bundle" >> $OUT/env.txt
# NO_FILE=1: a `file` that fails first on PATH, as on an image without file(1) (Triton 3.6 then keys its
# launchers and cuda_utils differently from a build where file is installed).
if [ "${NO_FILE:-0}" = 1 ]; then
  mkdir -p /tmp/nofile && printf '#!/bin/sh\nexit 1\n' > /tmp/nofile/file && chmod +x /tmp/nofile/file
  export PATH=/tmp/nofile:$PATH
  echo "file(1) hidden: $(python3 -c 'import platform; print(platform.architecture())')" >> $OUT/env.txt
fi
timeout ${PROFILE_TIMEOUT:-540} python3 scripts/gpu/first_call_profile.py --bundle "$bundle" --vocab ${VOCAB:-128256} \
  --runs ${RUNS:-3} --modes ${MODES:-bundle,seeded,warm} --out $OUT/first-call.json > $OUT/first-call.log 2>&1
echo "profile rc=$?"
tail -40 $OUT/first-call.log
