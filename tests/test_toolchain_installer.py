"""The CUDA toolchain for FlashInfer's module is fetched in a venv without pip (issue 41): ``uv venv`` seeds no pip
unless ``--seed``, and ``uv pip install vllm==0.33.0`` brings none, so ``python -m pip`` fails there. The fetch then
goes through uv on PATH; with neither, the build stops (exit 33) saying so, not "check the network".

Real processes: a ``python -m venv --without-pip`` venv with the checkout on PYTHONPATH, uv from build/uv, one of
the toolchain's own wheels (ninja, the smallest) fetched from the public index through the shared uv cache.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import ROOT
from helpers.wheel import require_uv, uv_env

from kernelcache.errors import ToolchainUnavailable

FETCH = """
import sys
from pathlib import Path
from kernelcache.errors import KernelcacheError
from kernelcache.exercise.flashinfer_sampling import _install_wheels
try:
    _install_wheels(Path(sys.argv[1]), print, ("ninja==1.13.2",))
except KernelcacheError as exc:
    print(f"error {exc.exit_code}: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
"""


@pytest.fixture(scope="module")
def no_pip(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("no-pip") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import pip"], capture_output=True).returncode != 0
    return python


def fetch(python: Path, target: Path, path: str) -> subprocess.CompletedProcess:
    env = uv_env(PYTHONPATH=str(ROOT), PATH=path)
    return subprocess.run([str(python), "-c", FETCH, str(target)], env=env, capture_output=True, text=True,
                          timeout=600)


def test_without_pip_the_toolchain_comes_through_uv(no_pip, tmp_path):
    uv = require_uv()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").symlink_to(uv.resolve())
    done = fetch(no_pip, tmp_path / "toolchain", f"{bin_dir}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "toolchain" / "bin" / "ninja").is_file()
    assert "+ ninja==1.13.2" in done.stdout


def test_without_pip_or_uv_the_build_is_told_what_to_install(no_pip, tmp_path):
    done = fetch(no_pip, tmp_path / "toolchain", "/usr/bin:/bin")
    assert done.returncode == ToolchainUnavailable.exit_code, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert "has no pip" in line and "uv on PATH" in line and "ensurepip" in line, line
    assert not (tmp_path / "toolchain").exists()
