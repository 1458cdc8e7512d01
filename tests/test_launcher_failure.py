"""A launcher that cannot be built fails the build instead of being left out silently (issue 13, defect 3).

The fake target builds Triton's per-kernel ``__triton_launcher`` and ``cuda_utils`` with the C compiler,
as a GPU would at first launch. A compiler that exits 0 and writes nothing (here: for launchers only)
used to be swallowed: the bundle lacked the launcher and the GPU compiled it at first launch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import TESTKERNELS, clean_env

import kernelcache
from kernelcache.errors import BuildFailed
from kernelcache.exercise.worker import Job
from kernelcache.plan.tasks import Task

pytest.importorskip("triton")

# Builds the libcuda stub and cuda_utils with gcc; "builds" each kernel launcher into nothing.
NO_LAUNCHER_CC = """#!/bin/sh
for arg in "$@"; do case "$arg" in *__triton_launcher.c) exit 0;; esac; done
exec gcc "$@"
"""


def no_launcher_cc(tmp_path: Path) -> str:
    cc = tmp_path / "cc-without-launchers"
    cc.write_text(NO_LAUNCHER_CC)
    cc.chmod(0o755)
    return str(cc)


def test_an_exercise_task_fails_when_its_launcher_cannot_be_built(tmp_path):
    job = Job(cache_dir=str(tmp_path / "cache"), compile_log=str(tmp_path / "compiles.jsonl"), capability=90,
              sm_count=132, mode="cross", tasks=(TESTKERNELS,))
    (tmp_path / "job.json").write_text(job.to_json())
    done = subprocess.run([sys.executable, "-m", "kernelcache.exercise.worker", str(tmp_path / "job.json")],
                          env=clean_env(CC=no_launcher_cc(tmp_path)), capture_output=True, text=True, timeout=900)
    result = json.loads((tmp_path / "job.json.result").read_text())
    assert done.returncode == 1 and not result["ok"]
    errors = [t["error"] for t in result["tasks"] if not t["ok"]]
    assert errors and errors[0].startswith("LauncherBuildError: cannot build Triton's launcher for kernel")


def test_build_fails_when_a_launcher_cannot_be_built(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv("CC", no_launcher_cc(tmp_path))
    # --dtype bfloat16 with the registry path selects no vLLM task: only the test kernels run.
    with pytest.raises(BuildFailed, match="LauncherBuildError: cannot build Triton's launcher"):
        kernelcache.build("sm_90", gpus=["h200"], dtypes=["bfloat16"], paths=["registry"], mode="cross",
                          output_dir=tmp_path / "out", extra_tasks=(Task(TESTKERNELS.call, label="testkernels"),))
    assert not list((tmp_path / "out").glob("*.tar.zst"))
