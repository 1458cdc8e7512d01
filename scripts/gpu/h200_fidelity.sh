#!/usr/bin/env bash
# One device call on the H200: issue 15's fidelity sweep (scripts/gpu/fidelity_sweep.py) for the CPU-built
# bundle in .carry/sweep/ over the vocab sizes it was built for. Results: $OUT/sweep.json, env.txt, logs.
# Run from the repo root with carry [".carry"] (scripts/gpu/prepare_carry.sh makes the vLLM tree; build the
# bundle on the CPU with the lab stack: see BENCHMARKS.md "Fidelity sweep" for the command).
set -uo pipefail
source scripts/gpu/harness.sh /tmp/kcs
bundle=$(ls .carry/sweep/*.tar.zst | head -1)
vocabs=""; for v in ${VOCABS:-}; do vocabs="$vocabs --vocab $v"; done
echo "$bundle ${vocabs:-every vocab size of its plan}" >> $OUT/env.txt
timeout ${SWEEP_TIMEOUT:-560} python3 scripts/gpu/fidelity_sweep.py --bundle "$bundle" $vocabs --work $T/sweep \
  --parallel ${PARALLEL:-9} --out $OUT/sweep.json 2> $OUT/sweep.err
echo "sweep rc=$?"
umount $T/sweep/served/cache 2>/dev/null || true
# Optional: a bundle built before the fix (.carry/sweep-prefix/), relocated but writable, to name what it lacked.
for old in .carry/sweep-prefix/*.tar.zst; do
  [ -f "$old" ] || continue
  timeout ${PREFIX_TIMEOUT:-240} python3 scripts/gpu/fidelity_sweep.py --bundle "$old" --work $T/prefix --writable \
    --no-cold --parallel 4 --out $OUT/sweep-prefix.json 2> $OUT/sweep-prefix.err
  echo "prefix sweep rc=$?"
done
# First-call profile (issue 16): bundle vs plain warm cache, fresh processes, the first call under cProfile.
timeout ${PROFILE_TIMEOUT:-300} python3 scripts/gpu/first_call_profile.py --bundle "$bundle" --vocab 128256 --runs 2 \
  --out $OUT/first-call.json > $OUT/first-call.log 2>&1
echo "profile rc=$?"
