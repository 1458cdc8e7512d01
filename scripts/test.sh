#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite plus the linter. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check kernelcache tests scripts
.venv/bin/python -m pytest -q "$@"
