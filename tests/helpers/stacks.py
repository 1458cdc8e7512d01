"""The two stacks a test can run its processes on (scripts/setup.sh): ``lab`` is this interpreter (Triton 3.6), and
``serving`` the serving-stack venv that scripts/test.sh names in KERNELCACHE_SERVING_VENV (``pip install
vllm==0.33.0``: Triton 3.8). A test that must hold on every supported Triton takes the ``stack`` fixture of
``stack_params``: its serving case is marked ``serving``, so it runs with the serving-stack tests (``-m serving``)
and skips where that venv is missing, as they do."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from .common import clean_env

STACKS = ("lab", pytest.param("serving", marks=pytest.mark.serving))


@dataclass(frozen=True)
class Stack:
    name: str
    python: str  # the stack's interpreter

    def run(self, *args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
        """``python ARGS`` of this stack, in a clean environment plus ``env``."""
        return subprocess.run([self.python, *args], env=clean_env(**(env or {})), capture_output=True, text=True,
                              timeout=timeout)

    def kc(self, *args: str, env: dict | None = None, check: bool = False,
           timeout: int = 900) -> subprocess.CompletedProcess:
        """The kernelcache CLI of this stack, as its users run it."""
        done = self.run("-m", "kernelcache", *args, env=env, timeout=timeout)
        if check:
            assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
        return done

    def triton(self) -> str:
        """Its Triton's version."""
        done = self.run("-c", "import triton; print(triton.__version__)", timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()


def stack(name: str) -> Stack:
    if name == "lab":
        return Stack("lab", sys.executable)
    from test_serving_stack import serving_venv  # skips (or fails under CI) without the venv

    return Stack("serving", str(serving_venv("KERNELCACHE_SERVING_VENV").root / "bin" / "python"))


def small_bundle(stack: Stack, work) -> object:
    """A bundle of the test kernels compiled for sm_90 by ``stack``'s own Triton (an exercise process, then
    ``kernelcache pack``), as a user of that stack would make one."""
    import json

    from kernelcache.exercise.worker import Job

    from .common import TESTKERNELS

    work.mkdir(parents=True, exist_ok=True)
    job = Job(cache_dir=str(work / "cache"), compile_log=str(work / "compiles.jsonl"), capability=90, sm_count=132,
              mode="cross", tasks=(TESTKERNELS,))
    (work / "job.json").write_text(job.to_json())
    done = stack.run("-m", "kernelcache.exercise.worker", str(work / "job.json"))
    assert done.returncode == 0, (done.stderr[-3000:], (work / "job.json.result").read_text()[-3000:])
    assert json.loads((work / "job.json.result").read_text())["ok"]
    out = work / f"test-{stack.name}-sm_90.tar.zst"
    stack.kc("pack", str(work / "cache"), "-o", str(out), "--compile-log", str(work / "compiles.jsonl"), check=True)
    return out
