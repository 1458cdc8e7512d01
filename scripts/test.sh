#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite plus the linter. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# CI builds FlashInfer's sampling module once (about 100 s); without it the FlashInfer tests would skip.
export KERNELCACHE_SETUP_FLASHINFER=${KERNELCACHE_SETUP_FLASHINFER:-1}
if [ "$KERNELCACHE_SETUP_FLASHINFER" = 1 ]; then export KERNELCACHE_REQUIRE_FLASHINFER=1; fi
bash scripts/setup.sh
.venv/bin/ruff check kernelcache tests scripts
.venv/bin/python -m pytest -q "$@"
