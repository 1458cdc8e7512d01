#!/usr/bin/env bash
# One device call (issue 32): the first sampler call of fresh processes as a user's process meets it, served by
# kernelcache against a plain warm Triton cache, in interleaved rounds, quiet and after other GPU work
# (scripts/gpu/first_call_rounds.py). Builds nothing on the GPU: it installs the first of BUNDLES (default: the CPU-
# built sampler bundles in .carry/fc/, one per GPU profile) that the GPU check accepts.
# Run from the repo root with carry [".carry"]: .carry/vllm-h200.tar.xz (scripts/gpu/prepare_carry.sh) and .carry/fc/
# (kernelcache build --arch sm_90 --gpu h100-sxm --gpu h200 --vocab 50257 --dtype float32 --dtype bfloat16
#  --path registry --path mrv1 --path mrv2 -o .carry/fc).
# Results under $OUT (6 files): env.txt (with the CPU count and NUMA nodes), driver.log, rows.jsonl, profiles.jsonl,
# summary.json, summary.md.
# ROUNDS (3), BUDGET (seconds after which no process starts or is released, 450), MODES (warm,served,served-walk;
# served-fresh: the first served process after a fresh install, each in a new cache dir; served-eager adds
# CUDA_MODULE_LOADING=EAGER), BATCH (15 processes started together). KC_GC_FREEZE=1: each process freezes its GC heap
# before the clock, as vLLM's worker does once started (freeze_gc_heap). Each timed part runs on one CPU (the
# highest; NO_PIN=1: any), the modes of a round in reverse order every other round, and each row keeps its first
# call's CPU time and page faults (summary.md: "the call's CPU", "CPU vs served").
# What a pod meets (issue 43): MODES=warm,served,served-fresh KC_GC_FREEZE=1 bash scripts/gpu/h200_first_call_rounds.sh
set -uo pipefail
source scripts/gpu/harness.sh /tmp/kcr
{ echo "cpus $(nproc)"; lscpu 2>/dev/null | grep -iE "model name|numa"; } >> "$OUT/env.txt"
export VLLM_USE_FLASHINFER_SAMPLER=0  # the image has no FlashInfer; the seeded paths are Triton's either way
timeout ${TIMEOUT:-520} python3 scripts/gpu/first_call_rounds.py --bundles "${BUNDLES:-.carry/fc/*.tar.zst}" \
  --out "$OUT" --rounds ${ROUNDS:-3} --budget ${BUDGET:-450} --modes ${MODES:-warm,served,served-walk} \
  --batch ${BATCH:-15} ${NO_PIN:+--no-pin} > "$OUT/driver.log" 2>&1
echo "rounds rc=$?"
tail -5 "$OUT/driver.log"
cat "$OUT/summary.md" 2>/dev/null
