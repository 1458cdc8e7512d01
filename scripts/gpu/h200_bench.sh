#!/usr/bin/env bash
# One device call on the H200: cold-start figures (scripts/bench_coldstart.py) for the CPU-built bundle
# in .carry/c, and the FlashInfer check (scripts/gpu/flashinfer_check.py). Results under $OUT.
# Run from the repo root with carry [".carry"].
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=/tmp/kcb; rm -rf $T; mkdir -p $T
(timeout 200 python3 scripts/gpu/flashinfer_check.py > $OUT/flashinfer.log 2>&1; echo "rc=$?" >> $OUT/flashinfer.log)
python3 -c "import tarfile; tarfile.open('.carry/vllm-h200.tar.xz').extractall('$T/vx', filter='fully_trusted')"
export PYTHONPATH=$PWD/scripts/gpu/site:$PWD:$T/vx/site:$T/vx/vllm PYTHONUNBUFFERED=1
timeout ${BENCH_TIMEOUT:-330} python3 scripts/bench_coldstart.py --bundle .carry/c/vllm-sampler-sm_90-h200.tar.zst \
  --vocab 128256 --runs ${RUNS:-5} --parallel ${PARALLEL:-3} --out $OUT/coldstart.json 2> $OUT/coldstart.rows.jsonl
echo "bench rc=$?"
tail -3 $OUT/flashinfer.log
