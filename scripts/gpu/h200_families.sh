#!/usr/bin/env bash
# One device call on the H200 for issue 14's runner and moe families: scripts/gpu/h200_runner.sh (the
# .carry/runner bundle), scripts/gpu/h200_moe.sh (the .carry/moe bundle, token counts up to MAX_M), then
# `kernelcache verify` of each bundle natively (the bundle's own plan replayed on real tensors), as far as
# the call's time allows. Results under $OUT (runner-check.json, moe.json, verify-{runner,moe}.json).
set -uo pipefail
max_m=${1:-8192}
bash scripts/gpu/h200_runner.sh
bash scripts/gpu/h200_moe.sh "$(ls .carry/moe/*.tar.zst | head -1)" "$max_m" > /dev/null
python3 -c "import json; d = json.load(open('$OUT/moe.json')); print({k: d.get(k) for k in ('cold', 'bundle', 'zero_compiles_with_bundle')}, d.get('compare'))"
source scripts/gpu/harness.sh /tmp/kcv
export VLLM_USE_FLASHINFER_SAMPLER=0
for family in runner moe; do
  HOME=$T/home-$family timeout ${VERIFY_TIMEOUT:-150} python3 -m kernelcache verify "$(ls .carry/$family/*.tar.zst | head -1)" \
    --cache-dir $T/$family/cache --json > $OUT/verify-$family.json 2> $OUT/verify-$family.err
  echo "verify $family rc=$?"
  python3 -c "import json; v = json.load(open('$OUT/verify-$family.json')); print({k: v.get(k) for k in ('ok', 'compiles', 'hits', 'seconds')})" 2>&1 | tail -1
done
