#!/usr/bin/env bash
# One device call (issue 28): the gated-delta-net layer's first call in fresh processes, cold, with the CPU-built
# bundle, and with a tuned bundle once `kernelcache tune` exists. The GPU may be an H100 SXM or an H200.
#   usage: bash scripts/gpu/h200_gdn.sh DIR
# DIR holds the CPU-built GDN bundles for both products, made on the CPU box with
#   kernelcache build --recipe qwen3-next-80b-a3b --arch sm_90 --path gdn --mode cross -o DIR
# (qwen3-next-80b-a3b-sm_90-h100-sxm.tar.zst and ...-h200.tar.zst). The bundle of the visible GPU's product is
# installed with `kernelcache install` at a new path under its own HOME; then scripts/gpu/gdn_check.py runs vLLM's
# QwenGatedDeltaNetAttention (Qwen3-Next-80B-A3B dims, FLA Triton prefill) over six steps in a fresh process per
# state: cold and cold2 (empty Triton caches), bundle (served through `kernelcache env`), tuned (the hook below),
# chosen (an empty cache seeded with the tuned choices alone: scripts/gpu/seed_choices.py), counting
# compiles and cache hits, gcc launcher builds, and the autotuner's benchmark runs (Triton's Autotuner._bench,
# wrapped), timing each step; outputs are compared with the cold run's and checked against a torch fp32 reference.
# Tuned: when this kernelcache has a `tune` command, `kernelcache tune BUNDLE -o DIR/tuned.tar.zst` runs here on this
# GPU, the result is installed at a third path and run the same way; TUNED=path/to/tuned.tar.zst skips the tune and
# uses that file. Without either, the tuned state is recorded as skipped. (The hook takes tune's output for a whole
# bundle; should tune write a layer instead, fold it in with `kernelcache merge` before the install below.)
# Results: $OUT/gdn.json (summary) and all.tgz (gdn-<state>.json, install and compare output, logs).
# Run from the repo root with carry [".carry"] (.carry/vllm-h200.tar.xz: scripts/gpu/prepare_carry.sh; DIR under
# .carry). About 3 minutes on an H100 (the cold run's FLA autotuning is most of it).
# CPU dry run: CROSS="90,132,NVIDIA H200" PATH=$PWD/.venv-lab/bin:$PATH bash scripts/gpu/h200_gdn.sh DIR runs the same
# states under kernelcache's fake target (gdn_check.py --cross: compiles, hits and benchmark runs; no outputs) with
# the lab venv's vLLM (the carried tree is the device's).
set -uo pipefail
dir=${1:?usage: h200_gdn.sh DIR}
source scripts/gpu/harness.sh /tmp/kcgdn
cross=${CROSS:-}
gpu=${cross##*,}
[ -z "$cross" ] || export PYTHONPATH=$PWD/scripts/gpu/site:$PWD  # the dry run: the venv's own vLLM, not the tree
[ -n "$cross" ] || gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in
  *H200*) product=h200 ;;
  *"H100 80GB HBM3"*) product=h100-sxm ;;
  *) echo "h200_gdn: no bundle for $gpu (h100-sxm or h200)" | tee "$OUT/gdn.json"; exit 2 ;;
esac
bundle=$(ls "$dir"/*-sm_90-"$product".tar.zst | head -1)
echo "gpu=$gpu bundle=$bundle" >> "$OUT/env.txt"
python3 -c "import transformers, einops; print('transformers', transformers.__version__, 'einops', einops.__version__)" \
  >> "$OUT/env.txt" 2>&1
install() {  # install NAME BUNDLE
  mkdir -p "$T/home-$1"
  HOME=$T/home-$1 python3 -m kernelcache install "$2" --cache-dir "$T/$1/cache" > "$OUT/install-$1.txt" 2>&1
  echo "install $1 rc=$?" | tee -a "$OUT/install-$1.txt"
}
check() {  # check NAME CACHE [served]: one fresh process, served through `kernelcache env` or a plain cache dir
  (
    export HOME=$T/home-$1 TRITON_CACHE_DIR=$2
    [ "${3:-}" = served ] && eval "$(python3 -m kernelcache env --cache-dir "$2")"
    timeout 420 python3 scripts/gpu/gdn_check.py run --cache-dir "$2" --out "$OUT/gdn-$1.json" \
      --outputs "$T/outputs-$1.pt" ${cross:+--cross "$cross"} > "$OUT/gdn-$1.log" 2>&1
  )
  echo "$1 rc=$?"
  [ "$1" = cold ] || [ -n "$cross" ] || python3 scripts/gpu/gdn_check.py compare "$T/outputs-cold.pt" \
    "$T/outputs-$1.pt" > "$OUT/compare-$1.json" 2> "$OUT/compare-$1.err"
}
mkdir -p "$T/cold" "$T/home-cold" "$T/cold2" "$T/home-cold2"
check cold "$T/cold"
check cold2 "$T/cold2"  # a second cold process: how much the autotuner's own choice varies between processes
install bundle "$bundle"
check bundle "$T/bundle/cache" served
tuned=${TUNED:-}
if [ -z "$tuned" ] && python3 -m kernelcache tune --help > /dev/null 2>&1; then
  mkdir -p "$T/home-tune"
  HOME=$T/home-tune timeout 300 python3 -m kernelcache tune "$bundle" -o "$T/tuned.tar.zst" > "$OUT/tune.txt" 2>&1
  echo "tune rc=$?" | tee -a "$OUT/tune.txt"
  tuned=$T/tuned.tar.zst
fi
if [ -n "$tuned" ] && [ -f "$tuned" ]; then
  install tuned "$tuned"
  check tuned "$T/tuned/cache" served
  # a cold process whose autotuner takes the tuned choices (seeded alone into an empty cache): it compiles
  # everything and must compute exactly what the tuned bundle serves
  mkdir -p "$T/chosen" "$T/home-chosen"
  python3 scripts/gpu/seed_choices.py "$tuned" "$T/chosen" >> "$OUT/tune.txt" 2>&1
  check chosen "$T/chosen"
  python3 scripts/gpu/gdn_check.py compare "$T/outputs-chosen.pt" "$T/outputs-tuned.pt" \
    > "$OUT/compare-tuned-vs-chosen.json" 2>> "$OUT/compare-chosen.err"
else
  echo '{"skipped": "no tuned bundle: this kernelcache has no `tune` command and TUNED is unset"}' > "$OUT/gdn-tuned.json"
fi
python3 - "$OUT" "$gpu" <<'PY' > "$OUT/gdn.json"
import json, sys
from pathlib import Path
out, gpu = Path(sys.argv[1]), sys.argv[2]
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{name}: {exc}"}
pick = ("profile_s", "first_call_s", "total_s", "compiles", "hits", "benchmark_runs", "benchmark_s", "gcc_builds", "reference",
        "autotuning_cache_env", "skipped", "error")
summary = {"gpu": gpu, "env": (out / "env.txt").read_text()}
runs = {state: load(f"gdn-{state}.json") for state in ("cold", "cold2", "bundle", "tuned", "chosen")}
for state, run in runs.items():
    summary[state] = {k: run[k] for k in pick if k in run}
    if (out / f"compare-{state}.json").exists():
        summary[state]["outputs_vs_cold"] = load(f"compare-{state}.json")
    if (out / f"install-{state}.txt").exists():
        summary[state]["install"] = (out / f"install-{state}.txt").read_text()[-600:]
summary["per_step"] = [{"step": c["step"], **{f"{s}_s": runs[s]["calls"][i]["seconds"] for s in runs
                                              if len(runs[s].get("calls", [])) > i},
                        **{f"{s}_compiles": runs[s]["calls"][i]["compiles"] for s in runs
                           if len(runs[s].get("calls", [])) > i},
                        **{f"{s}_benchmark_runs": runs[s]["calls"][i]["benchmark_runs"] for s in runs
                           if len(runs[s].get("calls", [])) > i}}
                       for i, c in enumerate(runs["cold"].get("calls", []))]
summary["autotune"] = {s: r.get("autotune") for s, r in runs.items() if "autotune" in r}
summary["describe"] = runs["bundle"].get("describe") or runs["cold"].get("describe")
summary["tuned_vs_chosen"] = load("compare-tuned-vs-chosen.json")
summary["tune"] = (out / "tune.txt").read_text()[-1500:] if (out / "tune.txt").exists() else None
summary["zero_compiles_with_bundle"] = runs["bundle"].get("compiles") == 0 and runs["bundle"].get("gcc_builds") == 0
print(json.dumps(summary, indent=1))
PY
tar -C "$T" -czf "$OUT/logs.tgz" --exclude='*/cache' home-cold home-bundle 2>/dev/null
head -c 9000 "$OUT/gdn.json"
tail -c 1500 "$OUT/gdn-bundle.log"
# What comes back from a device call is at most 8 files: the summary, and everything else in one archive.
(cd "$OUT" && tar -czf "$T/all.tgz" --exclude=gdn.json . && find . -mindepth 1 ! -name gdn.json -delete \
  && mv "$T/all.tgz" .)
