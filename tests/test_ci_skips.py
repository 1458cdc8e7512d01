"""Under CI every skip is a failure, and the summary prints the skip count (issue 13, defect 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast
HERE = Path(__file__).resolve().parent
SKIPPING = """
import pytest

def test_needs_something_missing():
    pytest.skip("no such thing here")

def test_fine():
    pass
"""
MODULE_SKIP = 'import pytest\npytest.importorskip("no_such_module_kernelcache")\n\ndef test_x():\n    pass\n'


def run_pytest(tmp_path: Path, source: str, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_demo.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(HERE)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "helpers.ci", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_demo.py")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)


def test_a_skip_passes_outside_ci_and_is_counted(tmp_path):
    done = run_pytest(tmp_path, SKIPPING, ci=None)
    assert done.returncode == 0, done.stdout
    assert "kernelcache: 1 skipped" in done.stdout and "1 passed, 1 skipped" in done.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_skip_fails_under_ci(tmp_path, ci):
    done = run_pytest(tmp_path, SKIPPING, ci=ci)
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed" in done.stdout and "no such thing here" in done.stdout
    assert "kernelcache: 1 skipped (CI: each one failed)" in done.stdout


def test_a_module_level_importorskip_fails_under_ci(tmp_path):
    done = run_pytest(tmp_path, MODULE_SKIP, ci="true")
    assert done.returncode != 0 and "no_such_module_kernelcache" in done.stdout
    assert "kernelcache: 1 skipped (CI: each one failed)" in done.stdout
