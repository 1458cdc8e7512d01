#!/usr/bin/env bash
# Build and CPU-verify each vLLM family on one serving venv with a small config, one path at a time, and print
# a line per path: path, build exit code, kernels, verify exit code, seconds. The table of issue 40 (path x vLLM
# release) comes from running it once per release venv (scripts/setup.sh, VLLM_VERSION=0.33.0 / 0.34.0):
#   PY=.venv-0.34/bin/python bash scripts/release_rerun.sh [PATH ...] > rerun-0.34.txt
# A path the installed release lacks exits 36 before any compile (plan/targets.py check_release).
set -uo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d /tmp/kc-rerun.XXXXXX)}
# BUILD_CACHE=DIR: take kernels earlier builds compiled (the test session's); default: none, every kernel compiled.
if [ -n "${BUILD_CACHE:-}" ]; then cache=(--build-cache "$BUILD_CACHE"); else cache=(--no-build-cache); fi
COMMON=(--arch sm_90 --gpu h100-sxm --mode cross "${cache[@]}" --jobs "${JOBS:-2}")
SMALL=(--max-num-seqs 4 --max-model-len 512 --max-num-batched-tokens 64)
args() {
  case "$1" in
    registry_mrv2) echo "--path registry --path mrv2 --vocab 32000 --max-num-seqs 4 --dtype float32" ;;
    mrv1) echo "--path mrv1 --vocab 32000 --max-num-seqs 4 --dtype float32" ;;
    flashinfer) echo "--path flashinfer --vocab 32000" ;;
    runner) echo "--recipe llama-3.1-8b --path runner --dtype bfloat16 ${SMALL[*]}" ;;
    attention) echo "--recipe llama-3.1-8b-triton-attn --path attention ${SMALL[*]}" ;;
    mrv1_spec_decode) echo "--path mrv1_spec_decode --num-speculative-tokens 1 --vocab 32000 --dtype float32 ${SMALL[*]}" ;;
    mrv2_spec_decode) echo "--path mrv2_spec_decode --num-speculative-tokens 1 --vocab 32000 --dtype bfloat16 ${SMALL[*]}" ;;
    moe) echo "--recipe qwen3-30b-a3b --path moe ${SMALL[*]}" ;;
    mamba) echo "--recipe nemotron-h-8b --path mamba ${SMALL[*]}" ;;
    gdn) echo "--recipe qwen3-next-80b-a3b --path gdn ${SMALL[*]}" ;;
    flashinfer_attention) echo "--recipe llama-3.1-8b-flashinfer --path flashinfer_attention ${SMALL[*]}" ;;
    *) echo "release_rerun: unknown path $1" >&2; exit 2 ;;
  esac
}
PATHS=("$@")
[ ${#PATHS[@]} -gt 0 ] || PATHS=(registry_mrv2 mrv1 runner attention mrv1_spec_decode mrv2_spec_decode moe mamba gdn
                                 flashinfer flashinfer_attention)
version=$("$PY" -c "import importlib.metadata as m; print(m.version('vllm'))")
for path in "${PATHS[@]}"; do
  dir="$OUT/$version/$path"; mkdir -p "$dir"
  start=$(date +%s)
  # shellcheck disable=SC2046
  "$PY" -m kernelcache build "${COMMON[@]}" $(args "$path") -o "$dir/bundles" --json >"$dir/build.json" 2>"$dir/build.err"
  rc=$?
  kernels=- vrc=-
  if [ $rc = 0 ]; then
    bundle=$(ls "$dir"/bundles/*.tar.zst | head -1)
    kernels=$("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); d=d['targets'] if isinstance(d, dict) else d; print(sum(b['kernels'] for t in d for b in t['bundles']))" "$dir/build.json" 2>/dev/null || echo "?")
    "$PY" -m kernelcache install "$bundle" --cache-dir "$dir/cache" >"$dir/install.out" 2>&1 \
      && "$PY" -m kernelcache verify "$bundle" --cache-dir "$dir/cache" >"$dir/verify.out" 2>&1
    vrc=$?
  fi
  echo "vllm $version | $path | build $rc | kernels $kernels | verify $vrc | $(( $(date +%s) - start )) s | $(tail -n 1 "$dir/build.err" | cut -c1-300)"
done
