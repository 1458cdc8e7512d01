# Sourced by scripts/setup.sh and scripts/release.sh (from the repository root): a Python 3.12 and uv, from the
# public package index alone, with no machine-wide pip or uv configuration (local wheel folders, constraints).
#   python312   prints a Python 3.12 interpreter: PYTHON=, else python3.12 on PATH, else pyenv's newest 3.12
#   UV          uv's binary: UV=, else build/uv/bin/uv, installed there from PyPI (with python312's pip) when missing
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_NO_INDEX
export UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1
unset UV_INDEX_URL UV_EXTRA_INDEX_URL UV_FIND_LINKS UV_CONSTRAINT UV_INDEX UV_DEFAULT_INDEX

python312() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  if python3.12 -c '' 2>/dev/null; then command -v python3.12; return; fi
  # pyenv keeps 3.12 out of PATH unless selected (its shim then fails to run): pick its newest 3.12 by path.
  local version
  version=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.|$)' | sort -V | tail -1 || true)
  if [ -n "$version" ]; then echo "$(pyenv root)/versions/$version/bin/python3.12"; return; fi
  echo "no Python 3.12 found (vLLM's images run 3.12); set PYTHON=/path/to/python3.12" >&2
  return 2
}

UV=${UV:-build/uv/bin/uv}
if ! [ -x "$UV" ]; then  # into a temporary dir, then one rename: two set-ups at once (scripts/test.sh) don't clash
  mkdir -p build
  uv_tmp=$(mktemp -d build/uv.XXXXXX)
  uv_python=$(python312)
  PIP_ROOT_USER_ACTION=ignore "$uv_python" -m pip install -q --disable-pip-version-check --target "$uv_tmp" "uv>=0.9,<1"
  mv -T "$uv_tmp" build/uv 2>/dev/null || rm -rf "$uv_tmp"
  UV=build/uv/bin/uv
fi
