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
python3 - "$OUT" "$T" <<'EOF' > "$OUT/build_cache.json"
import hashlib, json, sys
from pathlib import Path
out, work = Path(sys.argv[1]), Path(sys.argv[2])
summary = {"env": (out / "env.txt").read_text()}
for name in ("plain", "cold", "warm"):
    try:
        [target] = json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError) as exc:
        summary[name] = {"error": f"{exc}: {(out / f'{name}.err').read_text()[-1500:]}"}
        continue
    summary[name] = {"compiles": target["compiles"], "build_cache": target["build_cache"], "seconds": target["seconds"],
                     "bundles": {Path(b["path"]).name: hashlib.sha256(Path(b["path"]).read_bytes()).hexdigest()
                                 for b in target["bundles"]}}
digests = [summary.get(n, {}).get("bundles") for n in ("plain", "cold", "warm")]
summary["byte_identical"] = digests[0] is not None and digests.count(digests[0]) == 3
try:
    report = json.loads((out / "verify.json").read_text())
    summary["verify"] = {k: report.get(k) for k in ("ok", "compiles", "hits", "gcc_builds", "files_written")}
except (OSError, ValueError) as exc:
    summary["verify"] = {"error": f"{exc}: {(out / 'verify.err').read_text()[-1500:]}"}
print(json.dumps(summary, indent=1))
EOF
cat "$OUT/build_cache.json"
