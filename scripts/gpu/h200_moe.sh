#!/usr/bin/env bash
# One device call on the H200: the fused-MoE bundle built on the CPU (kernelcache's `moe` exercise task,
# exercise/vllm_moe.py) against vLLM's real MoE layer on real CUDA tensors.
#   usage: bash scripts/gpu/h200_moe.sh .carry/<dir>/<bundle>.tar.zst [MAX_M]
# The bundle is installed with `kernelcache install` at a new path; then scripts/gpu/moe_proof.py runs the
# layer (Qwen3-30B-A3B dims unless E/HIDDEN/INTER/TOPK are set) for M = 1 2 3 7 16 100 256 512 1000 MAX_M
# (default 1024: the largest M the bundle was built for) in fresh processes: once on an empty Triton cache
# (cold), once on the installed bundle, counting compiles vs cache hits and gcc launcher builds with
# kernelcache's listener and timing each call; then compares the two runs' outputs (must be identical).
# The C ops the pure-Python vLLM tree lacks run as torch code (exercise/fake_ops.py; listed in the JSON).
# Results: $OUT/moe.json (summary), $OUT/moe-{cold,bundle}.json, install and compare output, logs.
# Run from the repo root with carry [".carry"] (scripts/gpu/prepare_carry.sh makes the vLLM tree).
set -uo pipefail
bundle=${1:?usage: h200_moe.sh BUNDLE.tar.zst [MAX_M]}
max_m=${2:-1024}
source scripts/gpu/harness.sh /tmp/kcm
echo "$bundle max_m=$max_m" >> "$OUT/env.txt"
dims=()
for pair in E:num-experts HIDDEN:hidden-size INTER:intermediate-size TOPK:top-k; do
  var=${pair%%:*}; [ -n "${!var:-}" ] && dims+=("--${pair#*:}" "${!var}")
done
HOME=$T/home python3 -m kernelcache install "$bundle" --cache-dir "$T/bundle/cache" > "$OUT/install.txt" 2>&1
echo "install rc=$?" | tee -a "$OUT/install.txt"
mkdir -p "$T/cold"
for mode in cold bundle; do
  cache=$T/cold; [ "$mode" = bundle ] && cache=$T/bundle/cache
  timeout 540 python3 scripts/gpu/moe_proof.py run --cache-dir "$cache" --max "$max_m" "${dims[@]}" \
    --out "$OUT/moe-$mode.json" --outputs "$T/outputs-$mode.pt" > "$OUT/moe-$mode.log" 2>&1
  echo "$mode rc=$?"
done
python3 scripts/gpu/moe_proof.py compare "$T/outputs-cold.pt" "$T/outputs-bundle.pt" > "$OUT/compare.json" 2> "$OUT/compare.err"
echo "compare rc=$?"
python3 - "$OUT" <<'EOF' > "$OUT/moe.json"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{name}: {exc}"}
runs = {mode: load(f"moe-{mode}.json") for mode in ("cold", "bundle")}
pick = ("first_call_s", "total_s", "compiles", "hits", "gcc_builds", "reference", "error")
summary = {mode: {k: r[k] for k in pick if k in r} for mode, r in runs.items()}
summary["per_m"] = [{"m": c["m"], "cold_s": c["seconds"], "bundle_s": b["seconds"], "cold_compiles": c["compiles"],
                     "bundle_compiles": b["compiles"], "bundle_hits": b["hits"]}
                    for c, b in zip(runs["cold"].get("calls", []), runs["bundle"].get("calls", []))]
summary["compare"] = load("compare.json")
summary["describe"] = runs["bundle"].get("describe")
summary["substitutions"] = runs["bundle"].get("substitutions")
summary["zero_compiles_with_bundle"] = runs["bundle"].get("compiles") == 0 and runs["bundle"].get("gcc_builds") == 0
print(json.dumps(summary, indent=1))
EOF
tar -C "$T" -czf "$OUT/logs.tgz" home 2>/dev/null
head -c 6000 "$OUT/moe.json"
