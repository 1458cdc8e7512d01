#!/usr/bin/env bash
# One device call on the H200: a CPU-built bundle's Triton identity record (docs/FORMAT.md, triton_identity)
# against the GPU host's own Triton.
#   usage: bash scripts/gpu/h200_identity.sh .carry/identity/<bundle>.tar.zst
# 1. In one process: the fingerprint taken from the record (kernelcache/format/identity.py, before Triton is
#    imported) and Triton's own (fingerprint.local_environment): equal, field by field?
# 2. A cold `kernelcache install` into a fresh dir, 5 runs each, with the record and with the same bundle
#    without it (scripts/strip_identity.py): wall time, and whether the install imported Triton
#    (python -X importtime).
# Results: $OUT/identity.json, $OUT/installs.txt, $OUT/importtime-{record,plain}.txt.
set -uo pipefail
bundle=${1:?usage: h200_identity.sh BUNDLE.tar.zst}
source scripts/gpu/harness.sh /tmp/kcid
python3 scripts/strip_identity.py "$bundle" "$T/plain.tar.zst"
python3 scripts/gpu/identity_check.py "$bundle" > "$OUT/identity.json" 2> "$OUT/identity.err"
for kind in record plain; do
  b=$bundle; [ "$kind" = plain ] && b=$T/plain.tar.zst
  for i in 1 2 3 4 5; do
    s=$(date +%s%N); python3 -m kernelcache install "$b" --cache-dir "$T/$kind$i" > "$OUT/install-$kind$i.txt" 2>&1
    rc=$?; e=$(date +%s%N); echo "$kind run $i rc=$rc $(( (e - s) / 1000000 )) ms" | tee -a "$OUT/installs.txt"
  done
  python3 -X importtime -m kernelcache install "$b" --cache-dir "$T/imp-$kind" > /dev/null 2> "$OUT/importtime-$kind.txt"
  echo "$kind: triton modules imported by a cold install: $(grep -c '| *triton' "$OUT/importtime-$kind.txt")" | tee -a "$OUT/installs.txt"
done
cat "$OUT/env.txt"; head -c 1500 "$OUT/identity.json"; tail -5 "$OUT/identity.err"
