#!/usr/bin/env bash
# One device call (issue 39, the compile path): Llama-3.1-8B's real dimensions with dummy weights, the lab stack
# (the image's torch 2.11 / Triton 3.6, vLLM 0.33.0's pure-Python tree from .carry/c39), in three fresh processes
# of scripts/gpu/engine_compile_states.py run, each with the VllmConfig of one serve command ($SERVE):
#   cold    empty VLLM_CACHE_ROOT, fresh HOME (an empty Triton cache)
#   warm    the same VLLM_CACHE_ROOT and HOME again (vLLM's own warm cache on this box)
#   bundle  the bundle kernelcache built on the CPU box (kernelcache build --path compile), installed by
#           kernelcache install into a fresh cache dir under a fresh HOME, the variables of kernelcache env
#           (VLLM_CACHE_ROOT=<cache>/vllm, VLLM_FORCE_AOT_LOAD=1, TRITON_CACHE_DIR=<cache>)
# Every state runs the interpreter the bundle was built with (torch's SystemInfo pins Python's exact version; the
# image's is 3.12.3, the CPU box's 3.12.1): CPython 3.12.1 carried as .carry/c39b/python-3.12.1.tar.xz, with the
# image's own site-packages (torch, Triton, transformers: cp312 wheels) on its path.
# Results: $OUT/<state>.json (+ .log), $OUT/install.txt, $OUT/factors-diff.txt (every differing factor, field by
# field) + factors.json (both sets), $OUT/env.txt, $OUT/summary.txt.
# Carry: [".carry/c39", ".carry/c39b"] (scripts/gpu/prepare_compile_path_carry.sh makes c39b).
# STATES (default "cold warm bundle") picks the states; a bundle state without a cold one compares with nothing.
# Variables such as TORCH_LOGS="+torch._inductor.codecache" (Inductor's FX-graph cache key, factor by factor) reach
# every state.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=/tmp/kc39b; rm -rf "$T"; mkdir -p "$T"
C=.carry/c39b
python3 -c "import tarfile; tarfile.open('.carry/c39/vllm-tree.tar.xz').extractall('$T/vx', filter='fully_trusted')"
python3 -c "import tarfile; tarfile.open('$C/python-3.12.1.tar.xz').extractall('$T/py', filter='fully_trusted')"
# The build's transformers, huggingface_hub and tokenizers (ModelConfig hashes hf_config's JSON, which names
# transformers' version): first on the path unless KC_IMAGE_TRANSFORMERS=1
TF=""
if [ -f $C/site-transformers.tar.xz ] && [ "${KC_IMAGE_TRANSFORMERS:-0}" != 1 ]; then
  python3 -c "import tarfile; tarfile.open('$C/site-transformers.tar.xz').extractall('$T/tf', filter='fully_trusted')"
  TF=$T/tf:
fi
IMAGE_SITE=$(python3 -c "import sys; print(':'.join(p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))))")
PY=$T/py/bin/python3.12
export LD_LIBRARY_PATH=$T/py/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$PWD/scripts/gpu/site:$PWD:$TF$T/vx/site:$T/vx/vllm:$IMAGE_SITE PYTHONUNBUFFERED=1 PYTHONNOUSERSITE=1
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  for p in python3 "$PY"; do $p -c "import torch, triton, transformers, sys; print(sys.executable, sys.version.split()[0], torch.__version__, triton.__version__, 'transformers', transformers.__version__)"; done
  "$PY" -c "import sysconfig; print('include', sysconfig.get_paths()['include'])"
  gcc --version | head -1; } > "$OUT/env.txt" 2>&1
# The bundle of the product the device gave (the lease may give an H200 for an H100): build it with --gpu h200 too
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) PRODUCT=h200 ;;
  *) PRODUCT=h100-sxm ;;
esac
BUNDLE=$(ls $C/*-"$PRODUCT".tar.zst | head -1)
echo "product $PRODUCT bundle $BUNDLE" >> "$OUT/env.txt"
M=$(cat $C/model-path)
mkdir -p "$M" && cp scripts/gpu/models/llama-3.1-8b/config.json "$M/"
SERVE="vllm serve $M --attention-backend TRITON_ATTN --max-model-len 2048 --max-num-batched-tokens 2048 --max-num-seqs 64"
S=scripts/gpu/engine_compile_states.py
mkdir -p $T/home-cold $T/home-fresh $T/home-install
state() {  # state name, seconds, env... -- engine_compile_states.py run arguments
  local name=$1 limit=$2; shift 2
  env "$@" timeout "$limit" "$PY" $S run --model "$M" --serve "$SERVE" --out "$OUT/$name.json" \
    $( [ "$name" = cold ] && echo --save-output $T/cold.pt || echo --reference $T/cold.pt ) > "$OUT/$name.log" 2>&1
  echo "$name rc=$?"
}
STATES=" ${STATES:-cold warm bundle} "
[[ $STATES == *" cold "* ]] && state cold ${COLD_S:-280} HOME=$T/home-cold VLLM_CACHE_ROOT=$T/cold
[[ $STATES == *" warm "* ]] && state warm ${WARM_S:-150} HOME=$T/home-cold VLLM_CACHE_ROOT=$T/cold
{ HOME=$T/home-install "$PY" -m kernelcache install "$BUNDLE" --cache-dir $T/cache; echo "install rc=$?"
  HOME=$T/home-install "$PY" -m kernelcache env --cache-dir $T/cache --json > $T/env.json; echo "env rc=$?"
  cat $T/env.json; } > "$OUT/install.txt" 2>&1
# Every factor that differs between the bundle's record and this environment's (install names the first three),
# and both factor sets whole
HOME=$T/home-install "$PY" - "$BUNDLE" "$OUT" > "$OUT/factors-diff.txt" 2>&1 <<'PY'
import json, sys
from pathlib import Path
from kernelcache import enginecompile as ec
record = ec.bundle_records(Path(sys.argv[1]))[0]
here = ec.factors_here(record)
json.dump({"bundle": record, "here": here}, open(f"{sys.argv[2]}/factors.json", "w"), indent=1, default=str)
print("\n".join(ec.differences(record, here)) or "no factor differs")
PY
cat "$OUT/install.txt"
mapfile -t VARS < <("$PY" -c "import json; [print(f'{k}={v}') for k, v in json.load(open('$T/env.json')).items() if k != 'PYTHONPATH']")
[[ $STATES == *" bundle "* ]] && state bundle ${BUNDLE_S:-150} HOME=$T/home-fresh "${VARS[@]}"
du -sh $T/cold $T/cache/vllm >> "$OUT/env.txt" 2>&1
"$PY" - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out = sys.argv[1]
for state in ("cold", "warm", "bundle"):
    try:
        r = json.load(open(f"{out}/{state}.json"))
    except Exception as e:
        print(state, "no report", e); continue
    v, d, e = r.get("vllm_counters", {}), r.get("dynamo_stats", {}), r.get("events", {})
    print(state, "ok" if r["ok"] else "FAILED " + r.get("error", "")[:300],
          "| compile_phase_s", r.get("compile_phase_s"), "| dynamo traces", d.get("unique_graphs", 0),
          "| inductor compiles", v.get("num_inductor_compiles", 0), "| aot loads", v.get("num_aot_artifacts_loaded", 0),
          "| triton compiles", e.get("triton_compile", 0), "hits", e.get("triton_cache_hit", 0),
          "| gcc", e.get("gcc_build", 0), "| equal_to_cold", r.get("equal_to_reference"),
          "max_diff", r.get("max_abs_diff_vs_reference"), "| second_call_s", r.get("second_call_s"))
    print("   factors", r.get("factors"))
PY
