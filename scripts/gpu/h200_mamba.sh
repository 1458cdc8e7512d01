#!/usr/bin/env bash
# One device call on the H200: the Mamba-2 bundle built on the CPU (kernelcache's `mamba` exercise task,
# exercise/vllm_mamba.py, Nemotron-H-8B dims, 8 sequences, 512 batched tokens) against vLLM's real MambaMixer2
# on real CUDA tensors.
#   usage: bash scripts/gpu/h200_mamba.sh .carry/mamba/<bundle>.tar.zst
# The bundle is installed with `kernelcache install` at a new path; then scripts/gpu/mamba_check.py runs the
# layer's steps (prefill, decode, decode x8, mixed, continued chunked prefill, a 512-token prefill) in fresh
# processes: once on an empty Triton cache (cold), once on the installed bundle, counting compiles vs cache hits
# (the autotuner's benchmark compiles included) and gcc launcher builds with kernelcache's listener, timing each
# step, recording the autotuner's choices, its benchmark seconds and the autotune JSON it wrote; then compares
# the two runs' outputs (identical when the autotuner chose the same configs) and both against a torch reference.
# The import-time C op the pure-Python vLLM tree lacks is answered in Python (listed in the JSON).
# Results: $OUT/mamba.json (summary), $OUT/mamba-{cold,bundle}.json, install and compare output, logs.
# Run from the repo root with carry [".carry"] (scripts/gpu/prepare_carry.sh makes the vLLM tree).
set -uo pipefail
bundle=${1:?usage: h200_mamba.sh BUNDLE.tar.zst}
source scripts/gpu/harness.sh /tmp/kcmamba
echo "$bundle" >> "$OUT/env.txt"
HOME=$T/home python3 -m kernelcache install "$bundle" --cache-dir "$T/bundle/cache" > "$OUT/install.txt" 2>&1
echo "install rc=$?" | tee -a "$OUT/install.txt"
mkdir -p "$T/cold"
for mode in cold bundle; do
  cache=$T/cold; [ "$mode" = bundle ] && cache=$T/bundle/cache
  timeout 200 python3 scripts/gpu/mamba_check.py run --cache-dir "$cache" --out "$OUT/mamba-$mode.json" \
    --outputs "$T/outputs-$mode.pt" > "$OUT/mamba-$mode.log" 2>&1
  echo "$mode rc=$?"
done
python3 scripts/gpu/mamba_check.py compare "$T/outputs-cold.pt" "$T/outputs-bundle.pt" > "$OUT/compare.json" 2> "$OUT/compare.err"
echo "compare rc=$?"
python3 - "$OUT" <<'PY' > "$OUT/mamba.json"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{name}: {exc}"}
runs = {mode: load(f"mamba-{mode}.json") for mode in ("cold", "bundle")}
pick = ("first_call_s", "total_s", "compiles", "hits", "gcc_builds", "reference", "autotune_json", "error")
summary = {mode: {k: r[k] for k in pick if k in r} for mode, r in runs.items()}
summary["per_step"] = [{"step": c["step"], "cold_s": c["seconds"], "bundle_s": b["seconds"],
                        "cold_compiles": c["compiles"], "bundle_compiles": b["compiles"], "bundle_hits": b["hits"]}
                       for c, b in zip(runs["cold"].get("calls", []), runs["bundle"].get("calls", []))]
summary["autotune"] = {mode: r.get("autotune") for mode, r in runs.items()}
summary["compare"] = load("compare.json")
summary["describe"] = runs["bundle"].get("describe")
summary["substitutions"] = runs["bundle"].get("substitutions")
summary["zero_compiles_with_bundle"] = runs["bundle"].get("compiles") == 0 and runs["bundle"].get("gcc_builds") == 0
print(json.dumps(summary, indent=1))
PY
tar -C "$T" -czf "$OUT/logs.tgz" home 2>/dev/null
head -c 7000 "$OUT/mamba.json"
tail -c 1500 "$OUT/mamba-bundle.log"
