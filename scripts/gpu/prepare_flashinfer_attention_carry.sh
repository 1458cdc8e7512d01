#!/usr/bin/env bash
# Prepare .carry/ (git-ignored) for `python3 scripts/gpu/prove.py flashinfer_attention` on an sm_90 machine with no
# network:
#   flashinfer_attention/llama-3.1-8b-flashinfer-sm_90-h200.tar.zst  the bundle: `kernelcache build --recipe
#                     llama-3.1-8b-flashinfer` for sm_90 (FlashInfer's XQA decode and FA3 prefill modules built here
#                     by nvcc, the builder's Triton kernel), through the same CLI users run;
#   fi-site.tar.xz    flashinfer-python's Python package and dist-info, its own C++/CUDA tree (data/csrc, data/include)
#                     and, of the libraries it vendors (CUTLASS, CCCL, spdlog), only the files the modules' nvcc builds
#                     read (ninja's dependency record of each build), so the machine's nvcc can build the same modules
#                     cold; ninja; kernelcache's own dependencies;
#   vllm-h200.tar.xz  vLLM 0.33.0's pure-Python tree and the wheels it imports (scripts/gpu/prepare_carry.sh; copied
#                     from VLLM_CARRY when given).
# Run from the repo root of a checkout with .venv-lab (scripts/setup.sh). The FlashInfer workspace (the nvcc builds,
# minutes) is kept (KERNELCACHE_FLASHINFER_WORKSPACE, default build/flashinfer-jit), so reruns only repack.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv-lab/bin/python}
CARRY=.carry
OUT=$CARRY/flashinfer_attention
WORK=build/flashinfer-attention-carry
export KERNELCACHE_FLASHINFER_WORKSPACE=${KERNELCACHE_FLASHINFER_WORKSPACE:-$PWD/build/flashinfer-jit}
export MAX_JOBS=${MAX_JOBS:-1}
LIMIT_MIB=${LIMIT_MIB:-60}
rm -rf "$OUT" "$WORK" "$CARRY/fi-site.tar.xz"; mkdir -p "$OUT" "$WORK/site/bin" "$WORK/wheels"

# 1. The bundle.
nice -n 19 "$PY" -m kernelcache build --recipe llama-3.1-8b-flashinfer --arch sm_90 --gpu h200 --output-dir "$OUT" \
  --no-build-cache
NINJA_DIR=$("$PY" -c 'import kernelcache.exercise.flashinfer_sampling as f; print(f.ensure_toolchain().ninja_dir)')
export PATH=$NINJA_DIR:$PATH
# 2. FlashInfer: its Python package, and the files of its data/ tree that the bundled modules' builds read.
"$PY" - "$OUT" "$WORK/site" <<'PY'
import json, shutil, subprocess, sys, tarfile
from pathlib import Path
import flashinfer
from kernelcache.format import archive
out, site = Path(sys.argv[1]), Path(sys.argv[2])
package = Path(flashinfer.__file__).resolve().parent
manifest = archive.read_manifest(next(out.glob("*.tar.zst")))
workspace = next(Path(__import__("os").environ["KERNELCACHE_FLASHINFER_WORKSPACE"]).glob(".cache/flashinfer/*/90a/cached_ops"))
wanted = set()
for module in manifest.flashinfer:
    deps = subprocess.run(["ninja", "-t", "deps"], cwd=workspace / module.name, capture_output=True, text=True,
                          check=True).stdout
    wanted |= {Path(line.strip()) for line in deps.splitlines() if line.startswith(" ")
               and str(package / "data") in line}
# FlashInfer's generators copy and render files of data/csrc (templates, kernel sources) into its generated dir,
# which no dependency record names: carry its own C++/CUDA tree whole (4.7 MB as xz), the vendored ones as read.
wanted |= {p for part in ("csrc", "include") for p in (package / "data" / part).rglob("*") if p.is_file()}
sources = {".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc", ".c", ".inl", ".pyc"}  # outside data/: other modules' code
for path in package.rglob("*"):
    if path.is_file() and "data" not in path.relative_to(package).parts[:1] and path.suffix not in sources:
        wanted.add(path)
for path in sorted(wanted):
    target = site / "flashinfer" / path.relative_to(package)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, target)
dist = next(package.parent.glob("flashinfer_python-*.dist-info"))
shutil.copytree(dist, site / dist.name)
print(f"flashinfer: {len(wanted)} files")
PY
cp "$NINJA_DIR/ninja" "$WORK/site/bin/ninja"
PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$WORK/wheels" nvidia-ml-py packaging tqdm click filelock rich markdown-it-py mdurl pygments
for wheel in "$WORK"/wheels/*.whl; do "$PY" -m zipfile -e "$wheel" "$WORK/site/site"; done
mv "$WORK"/site/flashinfer* "$WORK/site/site/"
tar -C "$WORK/site" -cf - site bin | xz -9 -T1 > "$CARRY/fi-site.tar.xz"
# 3. vLLM's tree.
if [ -n "${VLLM_CARRY:-}" ]; then cp "$VLLM_CARRY" "$CARRY/vllm-h200.tar.xz"; else PY=$PY bash scripts/gpu/prepare_carry.sh; fi
du -ab "$CARRY" | sort -n | tail -8
total=$(du -sb "$CARRY" | cut -f1)
echo "total $((total / 1024)) KiB in $CARRY (limit ${LIMIT_MIB} MiB with the repo)"
[ "$total" -lt $((LIMIT_MIB * 1024 * 1024)) ] || { echo "error: $CARRY is over ${LIMIT_MIB} MiB" >&2; exit 1; }
