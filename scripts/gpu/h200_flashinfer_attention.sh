#!/usr/bin/env bash
# One device call on an H100/H200 (sm_90): the FlashInfer attention bundle built on the CPU (kernelcache's
# flashinfer_attention path, exercise/vllm_flashinfer.py) against vLLM's real FlashInfer backend on real tensors.
#   usage: bash scripts/gpu/h200_flashinfer_attention.sh [.carry-29/<bundle>.tar.zst]
# Carries .carry-29/ (scripts/gpu/prepare_flashinfer_attention_carry.sh): vllm-h200.tar.xz (vLLM's pure-Python tree
# and the wheels it imports), fi-site.tar.xz (flashinfer-python with only the sources these modules' builds read,
# ninja, kernelcache's own dependencies) and the bundle. The bundle is installed with `kernelcache install`; then
# scripts/gpu/flashinfer_attention_check.py runs the layer (Llama-3.1-8B dims, bf16, block 16) over its step list
# in fresh processes: once on the installed bundle (FLASHINFER_DISABLE_JIT=1), once with an empty Triton cache and
# an empty FlashInfer workspace (FlashInfer builds each module with this machine's nvcc), counting nvcc runs,
# Triton compiles and gcc launcher builds, timing each step, checking each against a dense fp32 reference; then
# compares the two runs' outputs (must be identical).
# Results: $OUT/flashinfer_attention.json (summary), $OUT/fa-{bundle,jit}.json, install output, logs.
# MODES="bundle" or MODES="jit" runs one of the two (JIT_TIMEOUT: the cold run's limit, default 400 s).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=/tmp/kcfa; rm -rf "$T"; mkdir -p "$T"
carry=.carry-29
bundle=${1:-$(ls $carry/*.tar.zst | head -1)}
python3 - "$carry" "$T" <<'PY'
import sys, tarfile
carry, t = sys.argv[1:]
for name, dest in (("vllm-h200.tar.xz", "vx"), ("fi-site.tar.xz", "fi")):
    tarfile.open(f"{carry}/{name}").extractall(f"{t}/{dest}", filter="fully_trusted")
PY
export PYTHONPATH=$PWD/scripts/gpu/site:$PWD:$T/fi/site:$T/vx/site:$T/vx/vllm PYTHONUNBUFFERED=1
export PATH=$T/fi/bin:$PATH
nvcc_path=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "${nvcc_path:-/usr/local/cuda/bin/nvcc}")")}
export MAX_JOBS=${MAX_JOBS:-16}
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"
  echo "bundle $bundle; CUDA_HOME $CUDA_HOME"; "$CUDA_HOME/bin/nvcc" --version | tail -2; ninja --version; } \
  > "$OUT/env.txt" 2>&1
HOME=$T/home python3 -m kernelcache install "$bundle" --cache-dir "$T/bundle/cache" > "$OUT/install.txt" 2>&1
echo "install rc=$?" | tee -a "$OUT/install.txt"
mkdir -p "$T/cold" "$T/ws-bundle" "$T/ws-jit"
for mode in ${MODES:-bundle jit}; do
  cache=$T/cold; [ "$mode" = bundle ] && cache=$T/bundle/cache
  limit=150; [ "$mode" = jit ] && limit=${JIT_TIMEOUT:-400}
  HOME=$T/home timeout "$limit" python3 scripts/gpu/flashinfer_attention_check.py run --mode "$mode" --cache-dir "$cache" \
    --workspace "$T/ws-$mode" --out "$OUT/fa-$mode.json" --outputs "$T/outputs-$mode.pt" > "$OUT/fa-$mode.log" 2>&1
  echo "$mode rc=$?"
done
python3 scripts/gpu/flashinfer_attention_check.py compare "$T/outputs-bundle.pt" "$T/outputs-jit.pt" \
  > "$OUT/compare.json" 2> "$OUT/compare.err"
echo "compare rc=$?"
python3 - "$OUT" <<'PY' > "$OUT/flashinfer_attention.json"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{name}: {exc}"}
runs = {mode: load(f"fa-{mode}.json") for mode in ("bundle", "jit")}
pick = ("device", "decode_kernel", "modules", "first_call_s", "first_call_by_kind_s", "total_s", "nvcc_runs",
        "compiles", "hits", "gcc_builds", "error")
summary = {mode: {k: r[k] for k in pick if k in r} for mode, r in runs.items()}
for mode, r in runs.items():
    summary[mode]["reference"] = {k: v for k, v in r.get("reference", {}).items() if k != "per_step"}
summary["per_step"] = [{"kind": b["kind"], "reqs": b["reqs"], "tokens": b["tokens"], "bundle_s": b["seconds"],
                        "jit_s": j["seconds"], "bundle_nvcc": b["nvcc"], "jit_nvcc": j["nvcc"],
                        "bundle_compiles": b["compiles"], "jit_compiles": j["compiles"]}
                       for b, j in zip(runs["bundle"].get("calls", []), runs["jit"].get("calls", []))]
summary["compare"] = load("compare.json")
summary["substitutions"] = runs["bundle"].get("substitutions")
b = runs["bundle"]
summary["zero_compiles_with_bundle"] = b.get("nvcc_runs") == 0 and b.get("compiles") == 0 and b.get("gcc_builds") == 0
print(json.dumps(summary, indent=1))
PY
tar -C "$T" -czf "$OUT/logs.tgz" home ws-jit/.cache/flashinfer 2>/dev/null --exclude='*.o' --exclude='*.so'
head -c 6000 "$OUT/flashinfer_attention.json"
