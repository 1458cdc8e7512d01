#!/usr/bin/env bash
# Set up, then a real pack/install round trip: compile kernelcache's own Triton kernels for sm_90
# on this CPU behind a fake driver, pack them, install at another path, and replay in a fresh process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
work=${1:-$(mktemp -d)}
cat > "$work/job.json" <<JSON
{"cache_dir": "$work/build", "compile_log": "$work/compiles.jsonl", "capability": 90, "sm_count": 132,
 "mode": "cross", "tasks": [{"call": "kernelcache.exercise.testkernels:run", "kwargs": {}, "label": "demo"}]}
JSON
.venv/bin/python -m kernelcache.exercise.worker "$work/job.json"
.venv/bin/kernelcache pack "$work/build" -o "$work/demo-sm_90.tar.zst" --compile-log "$work/compiles.jsonl"
rm -rf "$work/build"
.venv/bin/kernelcache install "$work/demo-sm_90.tar.zst" --cache-dir "$work/installed"
.venv/bin/kernelcache inspect "$work/demo-sm_90.tar.zst"
