#!/usr/bin/env bash
# One device call (issue 28): `kernelcache tune` on the CPU-built Nemotron-H Mamba-2 bundle, then Nemotron-H's
# Mamba-2 layer in fresh processes cold, with today's bundle and with the tuned bundle.
#   usage: bash scripts/gpu/h200_tune.sh DIR   (DIR holds <name>-sm_90-h100-sxm.tar.zst and <name>-sm_90-h200.tar.zst,
#          built on the CPU with the lab stack: kernelcache build --recipe nemotron-h-8b
#          --arch sm_90 --gpu h100-sxm --gpu h200 --path mamba --max-num-seqs 8 --max-num-batched-tokens 512 -o DIR)
# The bundle of the visible GPU's product (H100 SXM or H200) is tuned: `kernelcache tune` installs it into a fresh
# cache dir, replays its plan natively with Triton's autotune cache on (0 compiles expected), and writes the
# tuned bundle. Then the Mamba-2 check (scripts/gpu/checks/mamba.py, through scripts/gpu/prove.py --child with the
# bundle's mamba task) runs the layer's steps (prefill, decode, decode x8, mixed, continued chunked prefill, a
# 512-token prefill) in a fresh process each, every bundle installed at its own new
# path: cold (empty cache); today's bundle with plain TRITON_CACHE_DIR (as BENCHMARKS' 5.9 s row was measured);
# a second process on that same cache dir (whatever Triton kept from the first); today's bundle served through
# `kernelcache run`; the tuned bundle with plain TRITON_CACHE_DIR (vLLM's own
# TRITON_CACHE_AUTOTUNING=1 reads the choices); the tuned bundle served through `kernelcache run` (the target:
# first call <= 0.5 s, 0 benchmark runs); a cold process on an empty cache seeded with the tuned choices alone
# (scripts/gpu/seed_choices.py: it must compute what the tuned bundle serves). RUNS="cold2 chosen ..." picks the
# runs besides tuned-served (default: all). Each run counts compiles, gcc builds, candidate configs the autotuner
# timed and its disk lookups; outputs are compared with the cold run's. (Install's refusal of choices timed on
# another product is covered by tests/test_tune.py on the CPU.) Results: $OUT/tune_proof.json (summary),
# $OUT/mamba-<run>.json, tune.json, install, ls and env output, logs.
# Run from the repo root with carry [".carry"] (scripts/gpu/prepare_carry.sh makes the vLLM tree).
set -uo pipefail
dir=${1:?usage: h200_tune.sh DIR}
source scripts/gpu/harness.sh /tmp/kctune
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in
  *H200*) profile=h200 ;;
  *H100*) profile=h100-sxm ;;
  *) echo "unexpected GPU: $gpu"; exit 1 ;;
esac
bundle=$(ls "$dir"/*-sm_90-"$profile".tar.zst | head -1)
echo "gpu=$gpu profile=$profile bundle=$bundle" | tee -a "$OUT/env.txt"
export HOME=$T/home TMPDIR=$T/tmp  # a tune that fails keeps its exercise logs under $TMPDIR
mkdir -p "$HOME" "$TMPDIR" "$T/cold"
timeout 300 python3 -m kernelcache tune "$bundle" -o "$T/tuned.tar.zst" --json > "$OUT/tune.json" 2> "$OUT/tune.err"
echo "tune rc=$?" | tee -a "$OUT/tune.err"
python3 -m kernelcache inspect "$T/tuned.tar.zst" > "$OUT/inspect-tuned.txt" 2>&1
tasks=$(python3 scripts/gpu/prove.py mamba --bundle "mamba=$bundle" --print-tasks)
check() {  # check RUN CACHE [served]: one fresh process of the Mamba-2 check
  local name=$1 cache=$2 served=${3:-}
  local cmd=(env TRITON_CACHE_DIR="$cache" python3 scripts/gpu/prove.py --child mamba --tasks "$tasks"
             --result "$OUT/mamba-$name.json")
  if [ -n "$served" ]; then cmd=(python3 -m kernelcache run --cache-dir "$cache" -- "${cmd[@]}"); fi
  timeout 200 "${cmd[@]}" > "$OUT/mamba-$name.log" 2>&1
  echo "$name rc=$?"
}
install_at() {  # install_at NAME BUNDLE: a new cache dir per run, so no run sees choices another run wrote
  python3 -m kernelcache install "$2" --cache-dir "$T/$1/cache" --json > "$OUT/install-$1.json" 2> "$OUT/install-$1.err"
  echo "install $1 rc=$?"
}
want() {  # want RUN: RUNS="a b ..." picks runs (default: all)
  [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $1 "* ]]
}
want cold && check cold "$T/cold"
want cold2 && { mkdir -p "$T/cold2"; check cold2 "$T/cold2"; }  # a second cold process: the autotuner's own variance
want bundle && { install_at bundle "$bundle"; check bundle "$T/bundle/cache"; }
want bundle && check bundle-warm "$T/bundle/cache"  # a second process on that dir: Triton's own kept choices
want bundle-served && { install_at bundle-served "$bundle"; check bundle-served "$T/bundle-served/cache" served; }
want tuned && { install_at tuned "$T/tuned.tar.zst"; check tuned "$T/tuned/cache"; }
install_at tuned-served "$T/tuned.tar.zst"; check tuned-served "$T/tuned-served/cache" served
# a cold process whose autotuner takes the tuned choices (seeded alone into an empty cache): it compiles everything
# and must compute exactly what the tuned bundle serves
if want chosen; then
  mkdir -p "$T/chosen"
  python3 scripts/gpu/seed_choices.py "$T/tuned.tar.zst" "$T/chosen" > "$OUT/seed.txt" 2>&1
  check chosen "$T/chosen"
  python3 scripts/gpu/prove.py --compare "$OUT/mamba-chosen.json" "$OUT/mamba-tuned-served.json" \
    > "$OUT/compare-tuned-vs-chosen.json" 2> "$OUT/compare-tuned-vs-chosen.err"
fi
python3 -m kernelcache ls --cache-dir "$T/tuned-served/cache" --json > "$OUT/ls-tuned.json" 2>&1
python3 -m kernelcache env --cache-dir "$T/tuned-served/cache" --json > "$OUT/env-tuned.json" 2>&1
for name in cold2 bundle bundle-warm bundle-served tuned tuned-served chosen; do
  python3 scripts/gpu/prove.py --compare "$OUT/mamba-cold.json" "$OUT/mamba-$name.json" > "$OUT/compare-$name.json" \
    2> "$OUT/compare-$name.err"
done
# the same kept choices in a plain and a served process: identical outputs expected
python3 scripts/gpu/prove.py --compare "$OUT/mamba-tuned.json" "$OUT/mamba-tuned-served.json" \
  > "$OUT/compare-tuned-vs-served.json" 2> "$OUT/compare-tuned-vs-served.err"
python3 scripts/gpu/summarise_tune.py "$OUT" "$gpu" > "$OUT/tune_proof.json"
tar -C "$T" -czf "$OUT/logs.tgz" home $(cd "$T" && find tmp -name worker.log -o -name '*.result') 2>/dev/null
head -c 9000 "$OUT/tune_proof.json"
tail -c 1500 "$OUT/mamba-tuned-served.log"
# What comes back from a device call is at most 8 files: the summary, and everything else in one archive.
(cd "$OUT" && tar -czf "$T/all.tgz" --exclude=tune_proof.json . && find . -mindepth 1 ! -name tune_proof.json -delete \
  && mv "$T/all.tgz" .)
