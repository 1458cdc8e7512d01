#!/usr/bin/env bash
# One device call on the H200: the proof for the mrv2_spec_decode path (Model Runner V2's speculative decoding
# with EAGLE-3: its RejectionSampler, its Sampler with k + 1 logits per request, the EAGLE speculator's
# propose). The CPU-built bundle in .carry/mrv2spec/ (a cross build of
# kernelcache.exercise.vllm_mrv2_spec_decode:mrv2_spec_decode with the config below) is installed at a fresh
# path and scripts/gpu/mrv2_spec_decode_check.py runs the same entry point natively on real tensors in a fresh
# process, with the bundle (through `kernelcache env`) and with an empty cache: compiles vs disk hits, first
# drafted step seconds, output digests (must be equal). Run from the repo root with carry [".carry"].
# Usage: h200_mrv2_spec_decode.sh [CONFIG_JSON] [MODES]; results under $OUT.
set -uo pipefail
source scripts/gpu/harness.sh /tmp/kcm
export VLLM_USE_FLASHINFER_SAMPLER=0
bundle=$(ls .carry/mrv2spec/*.tar.zst | head -1)
echo "$bundle" >> $OUT/env.txt
config=${1:-'{"vocab": 128256, "max_num_seqs": 256, "num_speculative_tokens": 3, "max_model_len": 131072, "max_num_batched_tokens": 8192, "dtypes": ["bfloat16", "float32"], "method": "eagle3"}'}
HOME=$T/home-c timeout ${CHECK_TIMEOUT:-540} python3 scripts/gpu/mrv2_spec_decode_check.py --bundle "$bundle" \
  --config "$config" --modes "${2:-bundle,cold}" --out $OUT/mrv2-spec-check.json > $OUT/mrv2-spec-check.log 2>&1
echo "check rc=$?"
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
try:
    r = json.load(open(f"{out}/mrv2-spec-check.json"))
    print({"ok": r["ok"], "same_outputs": r["same_outputs"]})
    for row in r["rows"]:
        print({k: row.get(k) for k in ("mode", "compiles", "compile_events", "first_drafted_step_s", "all_s",
                                       "compiled", "error")})
except (OSError, ValueError, KeyError) as exc:
    print("no result:", exc)
PY
tail -c 1500 $OUT/mrv2-spec-check.log
