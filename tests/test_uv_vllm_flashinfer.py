"""The FlashInfer path built in a venv made as vLLM's docs say, ``uv pip install vllm==0.33.0`` (issue 41).

uv installs vLLM's wheels at once, and cuda-python 12.6.2.post1's wheel carries a ``cuda/bindings/`` of its own
that can replace files of cuda-bindings 13.5.0: ``import flashinfer`` then fails, and a build with a FlashInfer path
used to fail after every Triton compile had run. Now the preflight refuses it in seconds (exit 35) with the reinstall
that repairs it; with that done (or where uv's order left cuda-bindings intact) the build bundles FlashInfer's sampling
module and ``import flashinfer`` works in the venv. The build shares the session's build cache (tests/conftest.py),
so the module nvcc built for this FlashInfer release earlier in the session (``sampling90``: the same release,
toolchain and arch, hence the same key) is taken, not built a third time; nvcc's build itself is
tests/test_flashinfer.py's. kernelcache comes from the checkout (PYTHONPATH); the venv is uv's, from the serving
stack's cache.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers.common import ROOT, clean_env
from helpers.wheel import uv
from test_serving_stack import serving_venv

from kernelcache.errors import PackageClash
from kernelcache.format.archive import read_manifest

pytestmark = [pytest.mark.serving, pytest.mark.slow, pytest.mark.timeout(3600)]
FIX = re.compile(r"uv pip install --reinstall-package cuda-bindings (cuda-bindings==\S+)")


@pytest.fixture(scope="module")
def uv_vllm(tmp_path_factory) -> Path:
    python = serving_venv("KERNELCACHE_SERVING_VENV").root / "bin" / "python"  # a Python 3.12
    venv = tmp_path_factory.mktemp("uv-vllm") / "venv"
    uv("venv", "-q", "--seed", "--python", str(python), str(venv))
    uv("pip", "install", "-q", "--python", str(venv / "bin" / "python"), "vllm==0.33.0", "click>=8.1",
       "filelock>=3.12", "zstandard>=0.22", "rich>=13")
    return venv


def build(venv: Path, out: Path, cache: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "kernelcache", "build", "--arch", "sm_90", "--gpu",
                           "h200", "--path", "flashinfer", "--mode", "cross", "--build-cache", str(cache), "-o",
                           str(out)],
                          env=clean_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=3000)
    return done, time.monotonic() - started


def test_the_flashinfer_path_builds_in_a_uv_made_vllm_venv(uv_vllm, tmp_path, build_cache):
    done, seconds = build(uv_vllm, tmp_path / "out", build_cache)
    if done.returncode == PackageClash.exit_code:  # uv's order left the clash: refused before any compile
        [line] = done.stderr.strip().splitlines()
        assert seconds < 120 and not (tmp_path / "out").exists(), (seconds, line)
        fix = FIX.search(line)
        assert fix, line
        uv("pip", "install", "-q", "--python", str(uv_vllm / "bin" / "python"), "--reinstall-package",
           "cuda-bindings", fix[1])
        done, seconds = build(uv_vllm, tmp_path / "out", build_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    [bundle] = (tmp_path / "out").glob("*.tar.zst")
    [module] = read_manifest(bundle).flashinfer
    assert module.name == "sampling" and module.archs
    imported = subprocess.run([str(uv_vllm / "bin" / "python"), "-c", "import flashinfer"], env=clean_env(),
                              capture_output=True, text=True, timeout=600)
    assert imported.returncode == 0, imported.stderr[-2000:]
