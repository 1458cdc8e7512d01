#!/usr/bin/env bash
# One device call (issue 31): MoE bundles built on the CPU for two products of one arch and SM count, against
# the GPU's own product. vLLM ships Mixtral's fused-MoE tile configs (E=8, N=14336, bf16) for the H200 only, so
# the h100-sxm and h200 bundles hold different kernels.
#   usage: bash scripts/gpu/h200_device_keys.sh DIR   (DIR holds <name>-sm_90-h100-sxm.tar.zst and ...-h200.tar.zst)
# For each bundle: `kernelcache install` at a new path under its own HOME (rc and output kept). The bundle that
# install accepts runs vLLM's MoE layer (the moe check, scripts/gpu/checks/moe.py, through scripts/gpu/prove.py
# --child with the h200 bundle's moe task: Mixtral dims, every token count of checks/moe.py up to its
# max_num_batched_tokens) in a fresh process, after a cold run on an empty cache; outputs compared. The refused one is installed again with --force
# and run too, to show what the refusal saved (its compiles). Results: $OUT/device_keys.json and logs.
# Run from the repo root with carry [".carry"] (scripts/gpu/prepare_carry.sh makes the vLLM tree).
set -uo pipefail
dir=${1:?usage: h200_device_keys.sh DIR}
source scripts/gpu/harness.sh /tmp/kcdk
tasks=$(python3 scripts/gpu/prove.py moe --bundle "moe=$(ls "$dir"/*-sm_90-h200.tar.zst | head -1)" --print-tasks)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu=$gpu tasks=$tasks" >> "$OUT/env.txt"
run() {  # run NAME CACHE
  TRITON_CACHE_DIR=$2 timeout 400 python3 scripts/gpu/prove.py --child moe --tasks "$tasks" \
    --result "$OUT/moe-$1.json" > "$OUT/moe-$1.log" 2>&1
  echo "$1 rc=$?"
}
mkdir -p "$T/cold"
run cold "$T/cold"
for bundle in "$dir"/*-sm_90-h100-sxm.tar.zst "$dir"/*-sm_90-h200.tar.zst; do
  name=$(basename "$bundle" .tar.zst); name=${name##*-sm_90-}
  mkdir -p "$T/home-$name"
  HOME=$T/home-$name python3 -m kernelcache install "$bundle" --cache-dir "$T/$name/cache" > "$OUT/install-$name.txt" 2>&1
  rc=$?
  echo "install $name rc=$rc" | tee -a "$OUT/install-$name.txt"
  if [ "$rc" != 0 ]; then
    HOME=$T/home-$name python3 -m kernelcache install "$bundle" --cache-dir "$T/$name/cache" --force \
      > "$OUT/install-$name-force.txt" 2>&1
    echo "install --force $name rc=$?"
  fi
  run "$name" "$T/$name/cache"
  python3 scripts/gpu/prove.py --compare "$OUT/moe-cold.json" "$OUT/moe-$name.json" > "$OUT/compare-$name.json" 2>&1
done
python3 - "$OUT" "$gpu" <<'EOF' > "$OUT/device_keys.json"
import json, re, sys
from pathlib import Path
out, gpu = Path(sys.argv[1]), sys.argv[2]
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{name}: {exc}"}
summary = {"gpu": gpu, "env": (out / "env.txt").read_text()}
for name in ("cold", "h100-sxm", "h200"):
    run = load(f"moe-{name}.json")
    row = {k: run.get(k) for k in ("first_call_s", "total_s", "compiles", "hits", "gcc_builds", "error") if k in run}
    if name != "cold":
        text = (out / f"install-{name}.txt").read_text()
        row["install_rc"] = int(re.search(r"install \S+ rc=(\d+)", text).group(1))
        row["install_output"] = text[-1500:]
        row["outputs_vs_cold"] = load(f"compare-{name}.json")
    summary[name] = row
summary["describe"] = load("moe-cold.json").get("describe")
print(json.dumps(summary, indent=1))
EOF
head -c 8000 "$OUT/device_keys.json"
