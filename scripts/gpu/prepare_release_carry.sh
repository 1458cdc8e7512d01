#!/usr/bin/env bash
# Prepare the device proofs of one vLLM release (issue 40): its pure-Python tree and one bundle per family, built
# on the lab stack of that release (torch 2.11 / Triton 3.6, the GPU machine's; scripts/setup.sh STACK=lab
# VLLM_VERSION=...), into .carry/<name>/ (git-ignored; <= 64 MiB for a device call):
#   .carry/rel34/vllm-h200.tar.xz   vLLM's tree as scripts/gpu/prepare_carry.sh makes it, from the lab venv's copy
#   .carry/rel34/<check>/*.tar.zst  a bundle per GPU check (h100-sxm and h200), small configs
# Then, on the device (from the repo root, carrying .carry/rel34):
#   KERNELCACHE_VLLM_TREE=.carry/rel34/vllm-h200.tar.xz python3 scripts/gpu/prove.py sampler runner attention \
#     mrv2_spec_decode moe mamba gdn --bundle sampler=.carry/rel34/sampler ... --out $OUT
#   PY=.venv-lab-0.34/bin/python NAME=rel34 bash scripts/gpu/prepare_release_carry.sh [CHECK ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv-lab-0.34/bin/python}
NAME=${NAME:-rel34}
dest=.carry/$NAME; mkdir -p "$dest"
version=$("$PY" -c "import importlib.metadata as m; print(m.version('vllm'))")
site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")

# prepare_carry.sh's tree (every .so, vllm-rs and C/C++ source stripped) and site wheels, the tree from the lab
# venv (which installed the wheel's files as they are).
[ -f "$dest/vllm-h200.tar.xz" ] || VLLM_VERSION=$version VLLM_TREE_FROM=$site CARRY_FILE=$dest/vllm-h200.tar.xz \
  PY=${PIP_PY:-.venv/bin/python} bash scripts/gpu/prepare_carry.sh

COMMON=(--arch sm_90 --gpu h100-sxm --gpu h200 --mode cross --no-build-cache)
SMALL=(--max-num-seqs 8 --max-model-len 1024 --max-num-batched-tokens 256)
args() {
  case "$1" in
    sampler) echo "--path registry --path mrv2 --vocab 128256 --max-num-seqs 16 --dtype float32 --dtype bfloat16" ;;
    runner) echo "--recipe llama-3.1-8b --path runner --dtype bfloat16 --dtype float32 ${SMALL[*]}" ;;
    attention) echo "--recipe llama-3.1-8b-triton-attn --path attention ${SMALL[*]}" ;;
    mrv2_spec_decode) echo "--recipe llama-3.1-8b-eagle3 --path mrv2_spec_decode --dtype bfloat16 --dtype float32 ${SMALL[*]}" ;;
    moe) echo "--recipe qwen3-30b-a3b --path moe ${SMALL[*]}" ;;
    mamba) echo "--recipe nemotron-h-8b --path mamba ${SMALL[*]}" ;;
    gdn) echo "--recipe qwen3-next-80b-a3b --path gdn ${SMALL[*]}" ;;
    *) echo "prepare_release_carry: no config for $1" >&2; exit 2 ;;
  esac
}
CHECKS=("$@")
[ ${#CHECKS[@]} -gt 0 ] || CHECKS=(sampler runner attention mrv2_spec_decode moe mamba gdn)
for check in "${CHECKS[@]}"; do
  [ -n "$(ls "$dest/$check"/*.tar.zst 2>/dev/null)" ] && continue
  # shellcheck disable=SC2046
  "$PY" -m kernelcache build "${COMMON[@]}" $(args "$check") -o "$dest/$check"
done
du -sh "$dest"
