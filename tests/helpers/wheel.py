"""kernelcache as users install it: the release script's wheel, in venvs made by uv outside the checkout.

scripts/setup.sh installs uv in build/uv and keeps its cache in build/uv-cache (or UV_CACHE_DIR); venvs made
from that cache on the same file system are hard links, so a fresh ``pip install vllm==0.33.0`` venv costs
seconds. Without uv these tests skip (under CI, a failure).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .ci import under_ci
from .common import ROOT, clean_env

UV = ROOT / "build" / "uv" / "bin" / "uv"
RELEASE = ROOT / "scripts" / "release.sh"


def require_uv() -> Path:
    if not UV.is_file():
        message = f"{UV} is missing (scripts/setup.sh installs uv there)"
        if under_ci():
            pytest.fail(message)
        pytest.skip(message)
    return UV


def uv_env(**extra: str) -> dict[str, str]:
    """What scripts/setup.sh gives uv: its cache, the public index only, no pip configuration."""
    env = {k: v for k, v in clean_env().items() if not k.startswith(("UV_INDEX", "UV_EXTRA_INDEX", "UV_FIND_LINKS",
                                                                     "UV_CONSTRAINT", "UV_DEFAULT_INDEX", "PIP_"))}
    cache = os.environ.get("UV_CACHE_DIR", str(ROOT / "build" / "uv-cache"))
    env.update(UV_CACHE_DIR=cache, UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1", UV_LINK_MODE="hardlink",
               PIP_CONFIG_FILE="/dev/null", **extra)
    return env


def release(out: Path, tree: str = "worktree", **env: str) -> tuple[Path, Path]:
    """(sdist, wheel) that scripts/release.sh builds into ``out``: of the working tree (what the tests check while
    code changes) or of HEAD (``tree="head"``: a release)."""
    require_uv()
    env = {"KERNELCACHE_RELEASE_TREE": tree, "PYTHON": sys.executable, **env}
    done = subprocess.run(["bash", str(RELEASE), str(out)], env=uv_env(**env),
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    [sdist], [wheel] = sorted(out.glob("kernelcache-*.tar.gz")), sorted(out.glob("kernelcache-*.whl"))
    return sdist, wheel


def uv(*args: str, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run([str(require_uv()), *args], env=uv_env(**env), capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])
    return done


def site_packages(venv: Path) -> Path:
    [found] = (venv / "lib").glob("python3.*/site-packages")
    return found
