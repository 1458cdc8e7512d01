#!/usr/bin/env bash
# Prepare .carry/flashinfer/ (git-ignored) for scripts/gpu/flashinfer_check.py on a GPU machine with no network:
#   fi-sm_90.tar.zst  a kernelcache bundle: FlashInfer's sampling module built HERE, without a GPU, for sm_90 (90a)
#   site.tar.xz       flashinfer-python without its C++/CUDA sources and headers (a JIT-disabled load reads none),
#                     plus wheels for the target Python: apache-tvm-ffi, nvidia-ml-py, packaging, tqdm and
#                     kernelcache's own dependencies. torch, triton, numpy and requests are the machine's.
# Needs `KERNELCACHE_SETUP_FLASHINFER=1 bash scripts/setup.sh` first. PY_VERSION picks the target Python (3.12).
# The nvcc build dir (BUILD_DIR, about 100 s to fill) is kept under build/, so reruns only repack.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PY_VERSION=${PY_VERSION:-3.12}
OUT=.carry/flashinfer
WORK=build/flashinfer-carry
BUILD_DIR=${BUILD_DIR:-$WORK/build-sm_90}
LIMIT_MIB=${LIMIT_MIB:-45}
pip() { "$PY" -m pip -q --disable-pip-version-check "$@"; }

rm -rf "$OUT" "$WORK/site" "$WORK/wheels"
mkdir -p "$OUT" "$WORK/site" "$WORK/wheels"

# 1. The bundle, through the same API `kernelcache build` uses.
"$PY" - "$BUILD_DIR" "$OUT/fi-sm_90.tar.zst" <<'EOF'
import sys, time
from pathlib import Path
from kernelcache.version import __version__
from kernelcache.format.fingerprint import local_environment
from kernelcache.bundle.make import make_bundle
from kernelcache.format.manifest import Build, Target
from kernelcache.exercise.flashinfer_sampling import build_sampling

started = time.perf_counter()
module, members = build_sampling("sm_90", Path(sys.argv[1]), jobs=2)
built = time.perf_counter() - started
result = make_bundle(sys.argv[2], [], Target("cuda", "sm_90"), local_environment(["sm_90"]),
                     Build(f"kernelcache {__version__}", "cross"), flashinfer=((module, members),))
print(f"{module.name} {' '.join(module.archs)} flashinfer {module.version} CUDA {module.cuda}: build {built:.0f}s, "
      f"{len(members[0].read())} B .so -> {result.path} (digest {result.digest[:16]})")
EOF

# 2. Wheels for the target Python (pip's cache makes reruns cheap), unpacked into one site dir.
FI_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('flashinfer-python'))")
TVM_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('apache-tvm-ffi'))")
pip download --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$WORK/wheels" "flashinfer-python==$FI_VERSION" "apache-tvm-ffi==$TVM_VERSION" nvidia-ml-py packaging tqdm \
  click filelock zstandard rich markdown-it-py mdurl pygments
for wheel in "$WORK"/wheels/*.whl; do "$PY" -m zipfile -e "$wheel" "$WORK/site"; done

# 3. Strip what only a compile reads: FlashInfer's vendored CUTLASS/CCCL/spdlog, its csrc and headers.
rm -rf "$WORK"/site/flashinfer/data/{csrc,cutlass,cccl,spdlog,include}
find "$WORK/site" \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cc' \
  -o -name '*.inl' \) -delete
tar -C "$WORK/site" -cf - . | xz -9 -T2 > "$OUT/site.tar.xz"

# 4. Sizes, and what to run.
total=$(du -cb "$OUT"/* | tail -1 | cut -f1)
du -b "$OUT"/*
echo "total $((total / 1024)) KiB in $OUT (limit ${LIMIT_MIB} MiB with the repo)"
[ "$total" -lt $((LIMIT_MIB * 1024 * 1024)) ] || { echo "error: $OUT is over ${LIMIT_MIB} MiB" >&2; exit 1; }
echo 'on the GPU machine, from the repo root (carry: .carry/flashinfer):  python3 scripts/gpu/flashinfer_check.py'
