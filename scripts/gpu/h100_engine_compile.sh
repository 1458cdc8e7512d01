#!/usr/bin/env bash
# One device call (issue 39): vLLM 0.33's own torch.compile of a dense Llama model with dummy weights
# (scripts/gpu/engine_compile_states.py), per model in MODELS (default: llama-tiny llama-3.1-8b; configs under
# scripts/gpu/models/, placed at the same path in every state, as the model path is in vLLM's config hash), in four
# fresh processes:
#   cold       empty VLLM_CACHE_ROOT, fresh HOME (so an empty Triton cache)
#   warm       the same VLLM_CACHE_ROOT and HOME again (vLLM's own warm cache on this box)
#   build      the GPU hidden (CUDA_VISIBLE_DEVICES=""), kernelcache's fake sm_<cc> target for this product and the
#              CUDA-runtime shim preloaded: vLLM compiles and saves its AOT artifact without touching the device
#   cpu-built  that cache copied to another VLLM_CACHE_ROOT under a fresh HOME, VLLM_FORCE_AOT_LOAD=1
# Results: $OUT/<model>-<state>.json (+ .log), $OUT/env.txt. Carry: [".carry/c39"]
# (scripts/gpu/prepare_engine_compile_carry.sh makes it). STATES (default: all four, in that order) runs some;
# KEEP=1 keeps /tmp/kc39 from an earlier call on the same warm machine (the 8B model's states fit one call each
# way: STATES="cold warm", then KEEP=1 STATES="build cpu-built").
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=/tmp/kc39; [ "${KEEP:-0}" = 1 ] || rm -rf "$T"; mkdir -p "$T"
[ -d "$T/vx" ] || python3 -c "import tarfile; tarfile.open('.carry/c39/vllm-tree.tar.xz').extractall('$T/vx', filter='fully_trusted')"
export PYTHONPATH=$PWD/scripts/gpu/site:$PWD:$T/vx/site:$T/vx/vllm PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"
  gcc --version | head -1; } > "$OUT/env.txt" 2>&1
read -r product cap sms mem < <(python3 -c "
import torch; p = torch.cuda.get_device_properties(0)
print(p.name.replace(' ', '_'), '%d%d' % (p.major, p.minor), p.multi_processor_count, p.total_memory)")
product=${product//_/ }
echo "target: $product sm_$cap $sms SMs $mem bytes" | tee -a "$OUT/env.txt"
python3 -c "from kernelcache.exercise.fake_cuda_runtime import build_cudart_shim; print(build_cudart_shim('$T/shim'))"
S=scripts/gpu/engine_compile_states.py
STATES=" ${STATES:-cold warm build cpu-built} "
want() { [[ "$STATES" == *" $1 "* ]]; }
for m in ${MODELS:-llama-tiny llama-3.1-8b}; do
  M=$T/models/$m; mkdir -p "$M" "$T/$m/home-cold" "$T/$m/home-build" "$T/$m/home-fresh"
  cp scripts/gpu/models/$m/config.json "$M/"
  want cold && { HOME=$T/$m/home-cold VLLM_CACHE_ROOT=$T/$m/cold timeout 400 python3 $S run --model "$M" \
    --out "$OUT/$m-cold.json" --save-output "$T/$m-cold.pt" > "$OUT/$m-cold.log" 2>&1; echo "$m cold rc=$?"; }
  want warm && { HOME=$T/$m/home-cold VLLM_CACHE_ROOT=$T/$m/cold timeout 300 python3 $S run --model "$M" \
    --out "$OUT/$m-warm.json" --reference "$T/$m-cold.pt" > "$OUT/$m-warm.log" 2>&1; echo "$m warm rc=$?"; }
  want build && { CUDA_VISIBLE_DEVICES="" LD_PRELOAD=$T/shim/libkernelcache_cudart.so HOME=$T/$m/home-build \
    VLLM_CACHE_ROOT=$T/$m/built timeout 420 python3 $S build --model "$M" --out "$OUT/$m-build.json" \
    --product "$product" --capability "$cap" --sm-count "$sms" --memory "$mem" > "$OUT/$m-build.log" 2>&1
    echo "$m build rc=$?"; }
  want cpu-built && { rm -rf "$T/$m/elsewhere" "$T/$m/home-fresh"; mkdir -p "$T/$m/elsewhere" "$T/$m/home-fresh"
    cp -a "$T/$m/built" "$T/$m/elsewhere/root"
    HOME=$T/$m/home-fresh VLLM_CACHE_ROOT=$T/$m/elsewhere/root VLLM_FORCE_AOT_LOAD=1 timeout 300 python3 $S run \
      --model "$M" --out "$OUT/$m-cpu-built.json" --reference "$T/$m-cold.pt" > "$OUT/$m-cpu-built.log" 2>&1
    echo "$m cpu-built rc=$?"; }
  du -sh "$T/$m/cold" "$T/$m/built" >> "$OUT/env.txt" 2>&1
  python3 - "$OUT" "$m" <<'PY'
import json, sys
out, m = sys.argv[1], sys.argv[2]
for state in ("cold", "warm", "build", "cpu-built"):
    try:
        r = json.load(open(f"{out}/{m}-{state}.json"))
    except Exception as e:
        print(m, state, "no report", e); continue
    print(m, state, "ok" if r["ok"] else "FAILED " + r.get("error", "")[:300], "compile_phase_s", r.get("compile_phase_s"),
          "events", r.get("events"), "dynamo", r.get("dynamo_stats"), "vllm", r.get("vllm_counters"),
          "equal_to_cold", r.get("equal_to_reference"), "max_diff", r.get("max_abs_diff_vs_reference"))
    print("   factors", r.get("factors"))
PY
done
