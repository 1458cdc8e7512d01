"""Shared fixtures: real Triton compiles for a fake target in fresh subprocesses, real bundles,
and one real build of FlashInfer's sampling module with pip's nvcc (``sampling90``).

Under CI (``CI=true``, as GitHub Actions and .ci/run set it) every skip is a failure: a test that
cannot run there (vLLM missing, no mount rights, no registry server, no linter) must not pass as
"skipped". The summary always ends with the skip count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.ci import pytest_make_collect_report, pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401

from kernelcache.exercise.worker import Job
from kernelcache.plan.tasks import Task

ROOT = Path(__file__).resolve().parents[1]

TESTKERNELS = Task("kernelcache.exercise.testkernels:run", label="testkernels")


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without Triton/kernelcache settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRITON_", "KERNELCACHE_", "FLASHINFER_")) and k not in ("PTXAS_OPTIONS",)}
    env.update(extra)
    return env


def run_job(workdir: Path, cache_dir: Path, capability: int, tasks=(TESTKERNELS,), sm_count: int = 132,
            env: dict | None = None, prebuild: bool = True) -> tuple[dict, list[dict]]:
    """Run one exercise worker; return its result and its compile log."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "compiles.jsonl"
    log.unlink(missing_ok=True)
    job = Job(cache_dir=str(cache_dir), compile_log=str(log), capability=capability, sm_count=sm_count,
              mode="cross", tasks=tuple(tasks), prebuild=prebuild)
    path = workdir / "job.json"
    path.write_text(job.to_json())
    done = subprocess.run([sys.executable, "-m", "kernelcache.exercise.worker", str(path)],
                          env=clean_env(**(env or {})), capture_output=True, text=True, timeout=900)
    result = json.loads((workdir / "job.json.result").read_text())
    assert done.returncode == 0, (done.stderr[-3000:], result)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    records = [r for r in records if r.get("event", "compile") == "compile"]  # not the gcc builds
    return result, records


def kc(*args: str, env: dict | None = None, check: bool = False, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the kernelcache CLI in a subprocess (as users do)."""
    done = subprocess.run([sys.executable, "-m", "kernelcache", *args], env=clean_env(**(env or {})),
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    return done


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with (size, mtime_ns), to prove nothing was written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """Test kernels compiled for sm_90 and sm_100 into fresh caches: {capability: (cache, log)}."""
    caches = {}
    for capability in (90, 100):
        work = tmp_path_factory.mktemp(f"build{capability}")
        result, records = run_job(work, work / "cache", capability)
        assert result["ok"] and records
        caches[capability] = (work / "cache", work / "compiles.jsonl", records)
    return caches


@pytest.fixture(scope="session")
def bundle90(built, tmp_path_factory) -> Path:
    cache, log, _ = built[90]
    out = tmp_path_factory.mktemp("bundles") / "test-sm_90.tar.zst"
    kc("pack", str(cache), "-o", str(out), "--compile-log", str(log), check=True)
    return out


@pytest.fixture(scope="session")
def sampling90(tmp_path_factory):
    """FlashInfer's sampling module really built for sm_90 (about 100 s on 2 cores): (module, members, workdir).

    Every FlashInfer test reuses this one build. It runs as users run it, ``kernelcache build --path
    flashinfer`` (its bundle lands in ``workdir.parents[2] / "out"``); rerunning
    ``build_sampling`` in its kept work dir then finds nothing to do and returns the module and members.
    KERNELCACHE_TEST_FLASHINFER_WORKDIR keeps a build dir between runs while developing; CI leaves it unset.
    """
    from flashinfer_helpers import require_flashinfer

    require_flashinfer()
    from kernelcache.exercise.flashinfer import build_sampling

    if os.environ.get("KERNELCACHE_TEST_FLASHINFER_WORKDIR"):
        workdir = Path(os.environ["KERNELCACHE_TEST_FLASHINFER_WORKDIR"])
    else:
        scratch = tmp_path_factory.mktemp("fi-build90")
        kc("build", "--arch", "sm_90", "--gpu", "h200", "--path", "flashinfer", "--mode", "cross",
           "--workdir", str(scratch / "work"), "-o", str(scratch / "out"), check=True, timeout=1800)
        workdir = scratch / "work" / "sm_90-132sm" / "flashinfer"
    module, members = build_sampling("sm_90", workdir, jobs=2)
    return module, members, workdir


@pytest.fixture(scope="session")
def small_bundle(bundle90, tmp_path_factory) -> Path:
    """Three real kernels and one launcher of ``bundle90``: quick to install many times over."""
    from hostile import subset

    return subset(bundle90, tmp_path_factory.mktemp("small") / "small-sm_90.tar.zst")
