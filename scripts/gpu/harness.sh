# Sourced by the h200_*.sh device scripts, from the repo root: $OUT (default /tmp/out), a fresh work dir
# $T (the first argument), vLLM 0.33.0's pure-Python tree from .carry/vllm-h200.tar.xz unpacked into $T/vx
# and put on PYTHONPATH after the harness's site dir and this checkout, and $OUT/env.txt (GPU, driver,
# compute capability; Python, torch and Triton versions).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=$1; rm -rf "$T"; mkdir -p "$T"
python3 -c "import tarfile; tarfile.open('.carry/vllm-h200.tar.xz').extractall('$T/vx', filter='fully_trusted')"
export PYTHONPATH=$PWD/scripts/gpu/site:$PWD:$T/vx/site:$T/vx/vllm PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)"; } > "$OUT/env.txt" 2>&1
