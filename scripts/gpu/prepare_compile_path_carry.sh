#!/usr/bin/env bash
# Prepare .carry/c39b for scripts/gpu/h100_compile_path.sh (issue 39): the lab-stack bundle of Llama-3.1-8B's real
# dimensions built by kernelcache on this CPU box (build --path compile, the fake sm_90 target, H100 SXM and H200:
# the lease gives either), the model path it was built for (vLLM hashes the model string: the device places config.json there), and CPython 3.12.1
# (the interpreter the bundle was built with: torch's SystemInfo pins Python's exact version), trimmed (no test
# suite, IDLE, tkinter, ensurepip, static config, caches) but with its C headers (include/python3.12: Triton's driver
# builds cuda_utils.c against sysconfig.get_paths()["include"], which follows the extracted interpreter's prefix;
# the extension links no libpython). SERVE_ENV: the serving environment's hashed variables (vLLM's images and the
# device set CUDA_HOME=/usr/local/cuda), given to the build as --serve-env. .carry/c39 (vLLM's pure-Python tree) comes from
# scripts/gpu/prepare_engine_compile_carry.sh. Run from the repository root with the lab venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.carry/c39b; mkdir -p "$out"
PY=${PY:-.venv-lab/bin/python}
M=${MODEL_PATH:-/tmp/kc39b/models/llama-3.1-8b}
mkdir -p "$M" && cp scripts/gpu/models/llama-3.1-8b/config.json "$M/"
echo "$M" > "$out/model-path"
if ! ls "$out"/*.tar.zst >/dev/null 2>&1; then
  serve_env=(); for pair in ${SERVE_ENV:-CUDA_HOME=/usr/local/cuda}; do serve_env+=(--serve-env "$pair"); done
  /usr/bin/time -v "$PY" -m kernelcache build --arch sm_90 --gpu h100-sxm --gpu h200 --mode cross --path compile -o "$out" \
    "${serve_env[@]}" \
    -- vllm serve "$M" --attention-backend TRITON_ATTN --max-model-len 2048 --max-num-batched-tokens 2048 \
    --max-num-seqs 64 2> "$out/build-time.txt"
fi
home=$("$PY" -c "import sys; print(sys.base_prefix)")
version=$("$PY" -c "import platform; print(platform.python_version())")
tar -C "$home" --exclude='lib/python3.12/test' --exclude='lib/python3.12/idlelib' --exclude='lib/python3.12/tkinter' \
  --exclude='lib/python3.12/ensurepip' --exclude='lib/python3.12/site-packages' --exclude='lib/python3.12/config-*' \
  --exclude='__pycache__' --exclude='lib/python3.12/lib2to3' --exclude='lib/python3.12/turtledemo' \
  -cJf "$out/python-$version.tar.xz" bin/python3.12 lib/libpython3.12.so.1.0 lib/python3.12 include/python3.12
check=$(mktemp -d)  # extracted elsewhere, as the device does: its include path follows it and holds Python.h
tar -C "$check" -xJf "$out/python-$version.tar.xz"
LD_LIBRARY_PATH="$check/lib" "$check/bin/python3.12" -c "
import os, sys, sysconfig
inc = sysconfig.get_paths(scheme=sysconfig.get_default_scheme())['include']
assert inc.startswith(sys.argv[1]) and os.path.isfile(os.path.join(inc, 'Python.h')), inc
print('headers at', inc, 'EXT_SUFFIX', sysconfig.get_config_var('EXT_SUFFIX'))" "$check"
rm -rf "$check"
# The build's transformers with the hub client and tokenizers it needs (ModelConfig hashes hf_config's JSON, which
# names transformers' version: the device's own would change vLLM's key)
site=$("$PY" -c "import transformers, os; print(os.path.dirname(os.path.dirname(transformers.__file__)))")
# (tar's exit 1 is "file changed as we read it": the venvs' files are hard links of uv's cache, whose link count,
# and so ctime, changes while other venvs are made; the contents do not)
(cd "$site" && tar --exclude=__pycache__ --warning=no-file-changed -cJf - transformers transformers-*.dist-info \
  huggingface_hub huggingface_hub-*.dist-info tokenizers tokenizers-*.dist-info || [ $? -eq 1 ]) \
  > "$out/site-transformers.tar.xz"
ls -la "$out"; du -sh .carry/c39 "$out"
