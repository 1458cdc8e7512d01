"""`kernelcache capture -- CMD` packs what the command (and its children) compiled."""

from __future__ import annotations

import sys

from helpers.common import kc, run_job

from kernelcache.format import archive

SCRIPT = """
import os, sys
assert os.environ["TRITON_CACHE_DIR"]
from kernelcache.exercise import fake_target, testkernels
fake_target.activate(90, 132)
print("launches", testkernels.run())
"""


def test_capture_packs_a_grandchild_process_compiles_with_signatures(tmp_path):
    script = tmp_path / "work.py"
    script.write_text(SCRIPT)
    out = tmp_path / "captured.tar.zst"
    done = kc("capture", "-o", str(out), "--", "bash", "-c", f"{sys.executable} {script}", check=True)
    assert "captured 21 kernels" in done.stdout
    manifest = archive.read_manifest(out)
    assert manifest.target.arch == "sm_90"
    assert all(k.signature and k.constexprs is not None for k in manifest.kernels)
    assert {m.kind for m in manifest.modules} == {"launcher", "cuda_utils"}

    cache = tmp_path / "installed"
    kc("install", str(out), "--cache-dir", str(cache), check=True)
    _, replay = run_job(tmp_path / "w", cache, 90)
    assert replay and all(r["cache_hit"] for r in replay)


def test_capture_refuses_a_failing_command_and_writes_nothing(tmp_path):
    out = tmp_path / "x.tar.zst"
    done = kc("capture", "-o", str(out), "--", sys.executable, "-c", "raise SystemExit(3)")
    assert done.returncode == 51 and "exited with 3" in done.stderr
    assert not out.exists()
    done = kc("capture", "-o", str(out), "--", sys.executable, "-c", "pass")
    assert done.returncode == 2 and "compiled no Triton kernel" in done.stderr
