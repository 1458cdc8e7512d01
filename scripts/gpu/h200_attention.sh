#!/usr/bin/env bash
# One device call on the H200: the TRITON_ATTN bundle built on the CPU (kernelcache's `attention` exercise
# task, exercise/vllm_attention.py) against vLLM's real Triton attention backend on real CUDA tensors.
#   usage: bash scripts/gpu/h200_attention.sh .carry/<dir>/<bundle>.tar.zst [MAX_NUM_SEQS MAX_MODEL_LEN MAX_TOKENS]
# The bundle is installed with `kernelcache install` at a new path; then scripts/gpu/attention_check.py runs
# the layer (Llama-3.1-8B dims, bf16, block 16; defaults 256 / 8192 / 8192, the recipe the bundle was built
# for) over its step list in fresh processes: once on an empty Triton cache (cold), once on the installed
# bundle, counting compiles vs cache hits and gcc launcher builds with kernelcache's listener, timing each
# step and checking each against a dense fp32 reference; then compares the two runs' outputs (must be
# identical). No C op is on this path; the import shims used are listed in the JSON.
# Results: $OUT/attention.json (summary), $OUT/attention-{cold,bundle}.json, install and compare output, logs.
# Run from the repo root with carry [".carry"] (scripts/gpu/prepare_carry.sh makes the vLLM tree).
set -uo pipefail
bundle=${1:?usage: h200_attention.sh BUNDLE.tar.zst [MAX_NUM_SEQS MAX_MODEL_LEN MAX_TOKENS]}
limits=(--max-num-seqs "${2:-256}" --max-model-len "${3:-8192}" --max-num-batched-tokens "${4:-8192}")
source scripts/gpu/harness.sh /tmp/kca
echo "$bundle ${limits[*]}" >> "$OUT/env.txt"
HOME=$T/home python3 -m kernelcache install "$bundle" --cache-dir "$T/bundle/cache" > "$OUT/install.txt" 2>&1
echo "install rc=$?" | tee -a "$OUT/install.txt"
mkdir -p "$T/cold"
for mode in cold bundle; do
  cache=$T/cold; [ "$mode" = bundle ] && cache=$T/bundle/cache
  timeout 240 python3 scripts/gpu/attention_check.py run --cache-dir "$cache" "${limits[@]}" \
    --out "$OUT/attention-$mode.json" --outputs "$T/outputs-$mode.pt" > "$OUT/attention-$mode.log" 2>&1
  echo "$mode rc=$?"
done
python3 scripts/gpu/attention_check.py compare "$T/outputs-cold.pt" "$T/outputs-bundle.pt" > "$OUT/compare.json" 2> "$OUT/compare.err"
echo "compare rc=$?"
python3 - "$OUT" <<'PY' > "$OUT/attention.json"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{name}: {exc}"}
runs = {mode: load(f"attention-{mode}.json") for mode in ("cold", "bundle")}
pick = ("first_call_s", "total_s", "compiles", "hits", "gcc_builds", "keys", "error")
summary = {mode: {k: r[k] for k in pick if k in r} for mode, r in runs.items()}
for mode, r in runs.items():
    summary[mode]["reference"] = {k: v for k, v in r.get("reference", {}).items() if k != "per_step"}
summary["per_step"] = [{"kind": c["kind"], "reqs": c["reqs"], "tokens": c["tokens"], "cold_s": c["seconds"],
                        "bundle_s": b["seconds"], "cold_compiles": c["compiles"], "bundle_compiles": b["compiles"],
                        "bundle_hits": b["hits"]}
                       for c, b in zip(runs["cold"].get("calls", []), runs["bundle"].get("calls", []))
                       if c["compiles"] or b["compiles"] or b["hits"]]
summary["compare"] = load("compare.json")
summary["describe"] = runs["bundle"].get("describe")
summary["substitutions"] = runs["bundle"].get("substitutions")
summary["zero_compiles_with_bundle"] = runs["bundle"].get("compiles") == 0 and runs["bundle"].get("gcc_builds") == 0
print(json.dumps(summary, indent=1))
PY
tar -C "$T" -czf "$OUT/logs.tgz" home 2>/dev/null
head -c 5000 "$OUT/attention.json"
