#!/usr/bin/env bash
# One device call (issue 27): the build cache in a native build, on the GPU's real driver.
#   (a) `kernelcache build --mode native` without a build cache; (b) the same into an empty build cache (cold);
#   (c) again with that cache (warm: every kernel and launcher taken from it, nothing compiled); the three
#   bundles must be byte-identical; then `kernelcache verify` of (c)'s bundle, installed at a new path under a new
#   HOME (0 compiles on vLLM's real registry warmup, MRV1 and MRV2 paths).
# Results: $OUT/build_cache.json plus the builds' JSON and logs. Run from the repo root with carry [".carry"]
# (scripts/gpu/prepare_carry.sh makes the vLLM tree).
set -uo pipefail
source scripts/gpu/harness.sh /tmp/kcbc
export VLLM_USE_FLASHINFER_SAMPLER=0
ARGS=(--arch sm_90 --vocab 128256 --dtype float32 --path registry --path mrv1 --path mrv2 --mode native --jobs 2)
build() {  # build NAME FLAG...
  local name=$1; shift
  local start=$(date +%s.%N)
  HOME=$T/home-$name python3 -m kernelcache build "${ARGS[@]}" -o "$T/$name" --json "$@" > "$OUT/$name.json" \
    2> "$OUT/$name.err"
  echo "$name rc=$? wall=$(python3 -c "print(round($(date +%s.%N) - $start, 1))")" >> "$OUT/env.txt"
}
build plain --no-build-cache
build cold --build-cache "$T/cache"
build warm --build-cache "$T/cache"
bundle=$(ls "$T"/warm/*.tar.zst | head -1)
HOME=$T/home-verify python3 -m kernelcache verify "$bundle" --cache-dir "$T/relocated/cache" --json \
  > "$OUT/verify.json" 2> "$OUT/verify.err"
echo "verify rc=$?" >> "$OUT/env.txt"
python3 scripts/gpu/summarise_build_cache.py "$OUT" > "$OUT/build_cache.json"
cat "$OUT/build_cache.json"
