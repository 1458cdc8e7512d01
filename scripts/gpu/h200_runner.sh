#!/usr/bin/env bash
# One device call on the H200: the proof for the runner path (Model Runner V2's own Triton kernels).
# The CPU-built bundle in .carry/runner/ (a cross build of kernelcache.exercise.vllm_runner:runner for vocab
# 151936, 256 seqs, max_model_len 8192, 8192 batched tokens, bf16 + fp32 logits) is installed at a fresh path
# and scripts/gpu/runner_check.py runs the same entry point natively on real tensors in a fresh process,
# with the bundle (through `kernelcache env`) and with an empty cache: compiles vs disk hits, first-call
# seconds, output digests (must be equal). Run from the repo root with carry [".carry"]. Results under $OUT.
set -uo pipefail
source scripts/gpu/harness.sh /tmp/kcr
export VLLM_USE_FLASHINFER_SAMPLER=0
bundle=$(ls .carry/runner/*.tar.zst | head -1)
echo "$bundle" >> $OUT/env.txt
config='{"vocab": 151936, "max_num_seqs": 256, "max_model_len": 8192, "max_num_batched_tokens": 8192, "dtypes": ["bfloat16", "float32"]}'
HOME=$T/home-c timeout 500 python3 scripts/gpu/runner_check.py --bundle "$bundle" --config "$config" \
  --out $OUT/runner-check.json > $OUT/runner-check.log 2>&1; echo "check rc=$?"
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
try:
    r = json.load(open(f"{out}/runner-check.json"))
    print({"ok": r["ok"], "same_outputs": r["same_outputs"]})
    for row in r["rows"]:
        print({k: row.get(k) for k in ("mode", "compiles", "compile_events", "first_sampler_call_s", "all_s",
                                       "compiled", "error")})
except (OSError, ValueError, KeyError) as exc:
    print("no result:", exc)
PY
tail -c 2000 $OUT/runner-check.log
