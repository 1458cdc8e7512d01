#!/usr/bin/env bash
# One device call on the H200: issue 4's zero-compile proof for vocab 128256 and 151936.
#   (a) a bundle built natively on the H200, (b) one built on the same host with the GPU hidden
#   (cross mode, h200 profile), (c) one built on the CPU-only box (Python 3.12 + triton 3.6, carried in
#   .carry/c); each installed at a new path under a new HOME and checked with `kernelcache verify`
#   (vLLM's real registry warmup, MRV1 seeded Sampler and MRV2 seeded chain, run on the GPU); (c) once
#   more from a read-only bind mount. Results: $OUT/verify.json plus logs.
# Run from the repo root with carry [".carry"] (prepare with scripts/gpu/prepare_carry.sh).
set -uo pipefail
source scripts/gpu/harness.sh /tmp/kc
export VLLM_USE_FLASHINFER_SAMPLER=0
KC="python3 -m kernelcache"
ARGS="--arch sm_90 --gpu h200 --vocab 128256 --vocab 151936 --dtype float32 --dtype bfloat16 --path registry --path mrv1 --path mrv2 --jobs 2"
start=$(date +%s)
(HOME=$T/home-a $KC build $ARGS --mode native -o $T/bundles/a --json > $T/a.json 2> $T/a.err; echo $? > $T/a.rc) &
(HOME=$T/home-b CUDA_VISIBLE_DEVICES="" $KC build $ARGS --mode cross -o $T/bundles/b --json > $T/b.json 2> $T/b.err; echo $? > $T/b.rc) &
wait
echo "builds: $(( $(date +%s) - start ))s" >> $OUT/env.txt
mkdir -p $T/bundles/c && cp .carry/c/*.tar.zst $T/bundles/c/
for x in a b c; do
  (HOME=$T/home-v$x $KC verify $T/bundles/$x/vllm-sampler-sm_90-h200.tar.zst --cache-dir $T/relocated/$x/cache --json \
     > $T/verify-$x.json 2> $T/verify-$x.err; echo $? > $T/verify-$x.rc) &
done
wait
# read-only: install (c) at a new path, then make that path a read-only bind mount and verify it in place
HOME=$T/home-ro $KC install $T/bundles/c/vllm-sampler-sm_90-h200.tar.zst --cache-dir $T/ro/cache > $T/ro-install.txt 2>&1
ro=none
if mount --bind $T/ro/cache $T/ro/cache 2>>$T/ro-mount.err && mount -o remount,ro,bind $T/ro/cache 2>>$T/ro-mount.err; then
  ro=bind-mount
  touch $T/ro/cache/probe 2>>$T/ro-mount.err && ro=bind-mount-but-writable
fi
echo $ro > $T/ro.mode
HOME=$T/home-vro $KC verify --cache-dir $T/ro/cache --json > $T/verify-ro.json 2> $T/verify-ro.err; echo $? > $T/verify-ro.rc
python3 scripts/gpu/summarise_verify.py $T > $OUT/verify.json
cp $T/*.err $T/*.rc $T/ro.mode $OUT/ 2>/dev/null; tar -C $T -czf $OUT/logs.tgz a.json b.json bundles/a bundles/b 2>/dev/null
cat $OUT/verify.json | head -c 6000
