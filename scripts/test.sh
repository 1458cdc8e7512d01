#!/usr/bin/env bash
# Set up and run the whole test suite plus the linter, on both stacks (scripts/setup.sh):
#   lab      .venv-lab runs ruff and pytest (Python 3.12, triton 3.6.0)
#   serving  .venv (builds) and .venv-serve (a second plain `uv pip install vllm==0.33.0`, installs) are what
#            tests/test_serving_stack.py drives (pytest -m serving): the examples' build of one vocab with every
#            path, its install and cross verify in the other venv, the refusal of a lab bundle there, and
#            `build --target-env`. The two serving venvs (about 9 GB of downloads; uv hard-links the second
#            one from its cache, so both cost about 10 GB of disk) are made in the background while the lab
#            tests run; their log is build/serving-setup.log.
# STACKS=lab skips the serving venvs and their tests. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
STACKS=${STACKS:-lab serving}
# CI builds FlashInfer's sampling module once (about 100 s); without it the FlashInfer tests would skip.
export KERNELCACHE_SETUP_FLASHINFER=${KERNELCACHE_SETUP_FLASHINFER:-1}
if [ "$KERNELCACHE_SETUP_FLASHINFER" = 1 ]; then export KERNELCACHE_REQUIRE_FLASHINFER=1; fi
started=$(date +%s)
stamp() { echo "test.sh: $1 at +$(( $(date +%s) - started ))s"; }
serving=0
[[ " $STACKS " == *" serving "* ]] && serving=1

# pytest exit 5 (nothing collected: extra args selected no test of this run) is not a failure; the 15 slowest
# tests are listed at the end of each run (what to trim when CI grows).
pytest_run() { local rc=0; .venv-lab/bin/python -m pytest -q --durations=15 "$@" || rc=$?; [ "$rc" = 5 ] || return "$rc"; }

if [ "$serving" = 1 ]; then
  mkdir -p build
  # The build venv fetches FlashInfer's CUDA toolchain itself when it builds; the install venv needs none.
  ( STACK=serving KERNELCACHE_SETUP_DEV=0 KERNELCACHE_SETUP_FLASHINFER=0 bash scripts/setup.sh \
    && STACK=serving VENV=.venv-serve KERNELCACHE_SETUP_DEV=0 KERNELCACHE_SETUP_FLASHINFER=0 bash scripts/setup.sh \
  ) > build/serving-setup.log 2>&1 &
  serving_setup=$!
fi
STACK=lab bash scripts/setup.sh
stamp "lab stack set up"
.venv-lab/bin/ruff check kernelcache tests scripts
pytest_run -m "not serving" "$@"
stamp "lab tests done"
if [ "$serving" = 1 ]; then
  if ! wait "$serving_setup"; then
    tail -20 build/serving-setup.log >&2
    echo "test.sh: setting up the serving stack failed (build/serving-setup.log)" >&2
    exit 1
  fi
  stamp "serving stack set up (.venv, .venv-serve)"
  export KERNELCACHE_SERVING_VENV=$PWD/.venv KERNELCACHE_SERVING_VENV2=$PWD/.venv-serve KERNELCACHE_REQUIRE_SERVING=1
  pytest_run -m serving "$@"
  stamp "serving tests done"
fi
