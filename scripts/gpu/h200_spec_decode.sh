#!/usr/bin/env bash
# One device call on the H200: issue 14's proof for the V1 runner's speculative decoding (mrv1_spec_decode).
# The CPU-built bundle in .carry/spec/ (vocab 128256, 256 seqs, 3 drafts) is installed at a fresh path and
#   (a) `kernelcache verify` replays its plan on the GPU (vLLM's warmup registry over RejectionSampler and
#       EAGLE's registrations, RejectionSampler.forward over the build's draft layouts): compiles counted;
#   (b) scripts/gpu/spec_decode_check.py runs a seeded sweep the build never ran on real values, with the
#       bundle (through `kernelcache env`) and with an empty cache: compiles, first-call seconds, outputs.
# Run from the repo root with carry [".carry"]. Results under $OUT.
set -uo pipefail
source scripts/gpu/harness.sh /tmp/kcs
export VLLM_USE_FLASHINFER_SAMPLER=0
bundle=$(ls .carry/spec/*.tar.zst | head -1)
echo "$bundle" >> $OUT/env.txt
HOME=$T/home-v timeout 300 python3 -m kernelcache verify "$bundle" --cache-dir $T/relocated/cache --json \
  > $OUT/verify.json 2> $OUT/verify.err; echo "verify rc=$?"
HOME=$T/home-c timeout 240 python3 scripts/gpu/spec_decode_check.py --bundle "$bundle" --vocab 128256 \
  --out $OUT/spec-check.json > $OUT/spec-check.log 2>&1; echo "check rc=$?"
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
v = json.load(open(f"{out}/verify.json")) if os.path.getsize(f"{out}/verify.json") else {}
print({k: v.get(k) for k in ("ok", "compiles", "hits", "calls", "seconds") if k in v} or open(f"{out}/verify.err").read()[-1500:])
PY
tail -c 2500 $OUT/spec-check.log
