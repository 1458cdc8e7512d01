#!/usr/bin/env bash
# Set up and run the whole test suite plus the linter, on both stacks (scripts/setup.sh):
#   lab      .venv-lab runs ruff and pytest (Python 3.12, triton 3.6.0)
#   serving  .venv (builds) and .venv-serve (a second plain `pip install vllm==0.33.0`, installs) are what
#            tests/test_serving_stack.py drives: a build of one vocab with every path, its install and cross
#            verify in the other venv, the refusal of a lab bundle there, `build --target-env`, the examples.
# STACKS=lab skips the serving venvs (about 9 GB each) and their tests. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
STACKS=${STACKS:-lab serving}
# CI builds FlashInfer's sampling module once (about 100 s); without it the FlashInfer tests would skip.
export KERNELCACHE_SETUP_FLASHINFER=${KERNELCACHE_SETUP_FLASHINFER:-1}
if [ "$KERNELCACHE_SETUP_FLASHINFER" = 1 ]; then export KERNELCACHE_REQUIRE_FLASHINFER=1; fi
stamp() { echo "test.sh: $1 at +$(( $(date +%s) - started ))s"; }
started=$(date +%s)
STACK=lab bash scripts/setup.sh
stamp "lab stack set up"
if [[ " $STACKS " == *" serving "* ]]; then
  # The build venv fetches FlashInfer's CUDA toolchain itself when it builds; the install venv needs none.
  STACK=serving KERNELCACHE_SETUP_DEV=0 KERNELCACHE_SETUP_FLASHINFER=0 bash scripts/setup.sh
  STACK=serving VENV=.venv-serve KERNELCACHE_SETUP_DEV=0 KERNELCACHE_SETUP_FLASHINFER=0 bash scripts/setup.sh
  export KERNELCACHE_SERVING_VENV=$PWD/.venv KERNELCACHE_SERVING_VENV2=$PWD/.venv-serve KERNELCACHE_REQUIRE_SERVING=1
  stamp "serving stack set up (.venv, .venv-serve)"
fi
.venv-lab/bin/ruff check kernelcache tests scripts
.venv-lab/bin/python -m pytest -q "$@"
stamp "tests done"
