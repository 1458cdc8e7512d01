#!/usr/bin/env bash
# One device call on the H200: what kernelcache costs a pod's start there, where the GPU check is real.
#   usage: bash scripts/gpu/h200_podstart.sh BUNDLE.tar.zst BEFORE_TREE
# 1. scripts/bench_podstart.py, BEFORE_TREE (a kernelcache checkout from before) against this one: no-op
#    install, env, cold install, run and run --bundle, 15 interleaved rounds (the GPU probe runs as for users).
# 2. The record of a checked install (kernelcache/cachedir/checked.py) against the real GPU probe: after an
#    install that probed the GPU, a no-op install imports neither click nor the installer (python -X importtime);
#    with CUDA_VISIBLE_DEVICES changed, it probes again (the installer is imported); with a GPU hidden
#    (CUDA_VISIBLE_DEVICES=""), too.
# Results: $OUT/podstart.txt, $OUT/witness.txt.
set -uo pipefail
bundle=${1:?usage: h200_podstart.sh BUNDLE BEFORE_TREE}; before=${2:?usage: h200_podstart.sh BUNDLE BEFORE_TREE}
source scripts/gpu/harness.sh /tmp/kcpod
bench() { python3 scripts/bench_podstart.py --bundle "$bundle" --source "before=$before" --source after=. --runs 15 \
  --site "$T/vx/site" "$@"; }
bench > "$OUT/podstart.txt" 2>&1 || bench --no-as-installed > "$OUT/podstart.txt" 2>&1  # no venv module: as it is
imports() {  # which of click / kernelcache.install a command imported, and its exit code
  python3 -X importtime -m kernelcache "$@" > /dev/null 2> "$T/imp.txt"; rc=$?
  echo "rc=$rc click=$(grep -c '| click$' "$T/imp.txt") installer=$(grep -c '| kernelcache.install$' "$T/imp.txt")"
}
{
  python3 -m kernelcache install "$bundle" --cache-dir "$T/w"
  echo "no-op after a probed install: $(imports install "$bundle" --cache-dir "$T/w")"
  echo "CUDA_VISIBLE_DEVICES=0: $(CUDA_VISIBLE_DEVICES=0 imports install "$bundle" --cache-dir "$T/w")"
  echo "again, CUDA_VISIBLE_DEVICES=0: $(CUDA_VISIBLE_DEVICES=0 imports install "$bundle" --cache-dir "$T/w")"
  echo "CUDA_VISIBLE_DEVICES='': $(CUDA_VISIBLE_DEVICES= imports install "$bundle" --cache-dir "$T/w")"
  python3 scripts/gpu/gpu_witness.py
} > "$OUT/witness.txt" 2>&1
cat "$OUT/env.txt" "$OUT/witness.txt"; tail -25 "$OUT/podstart.txt"
