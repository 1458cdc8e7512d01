"""Running exercise processes: one ``Job`` per unit of the plan (plan/tasks.py), ``--jobs`` at a time, results typed.

Each exercise process (exercise/worker.py) gets a fresh ``TRITON_CACHE_DIR`` shared by the target's
jobs, its own compile log, and a ``CC`` that makes gcc-built modules reproducible. What comes back is
read once into typed records: a ``WorkerResult`` per process (task outcomes, the environment
fingerprint it compiled under) and one ``ExerciseLog`` (every compile() call and gcc build).
Ctrl-C or SIGTERM stops every running process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from ..errors import BuildFailed
from ..format.compilelog import ExerciseLog
from ..format.manifest import Environment
from ..plan import families
from ..plan.recipe import BuildPlan
from ..plan.targets import BuildTarget
from ..plan.tasks import SAMPLER, Task, plan_units
from .device_tables import candidates_env
from .worker import Job


@dataclass(frozen=True)
class TaskOutcome:
    label: str
    ok: bool
    error: str | None = None
    seconds: float = 0.0
    summary: object = None


@dataclass(frozen=True)
class WorkerResult:
    """What one exercise process reported (``<job>.json.result``, read here only)."""

    ok: bool
    tasks: tuple[TaskOutcome, ...]
    launchers_initialised: int = 0
    seconds: float = 0.0
    environment: Environment | None = None  # the fingerprint it compiled under (None: Triton unusable)
    triton_identity: dict | None = None  # its Triton by content (format/identity.py), None if it has none
    walks: dict | None = None  # Triton's walks of the @jit functions it ran (hooks/kernelcache_walks.py walk_records)

    @classmethod
    def read(cls, path: Path) -> WorkerResult:
        data = json.loads(path.read_text())
        tasks = tuple(TaskOutcome(t.get("label", "?"), bool(t.get("ok")), t.get("error"), t.get("seconds", 0.0),
                                  t.get("summary")) for t in data.get("tasks", ()))
        env = data.get("environment")
        return cls(bool(data.get("ok")), tasks, int(data.get("launchers_initialised") or 0),
                   float(data.get("seconds") or 0.0), Environment(**env) if env else None,
                   data.get("triton_identity"), data.get("walks"))


@dataclass(frozen=True)
class ExerciseRun:
    """Every exercise process of one target: their results, their merged log, how many tasks ran."""

    results: tuple[WorkerResult, ...]
    log: ExerciseLog
    tasks: int = 0
    jobs: tuple[tuple[Path, Job], ...] = ()  # each unit's job dir and job, in plan order
    restored: frozenset[Path] = frozenset()  # job dirs of the units ``reuse`` restored instead of running them

    def ran_log(self) -> ExerciseLog:
        """The log of the units that ran in this build (a restored unit's log tells of an earlier build's work)."""
        return ExerciseLog.read(job.compile_log for job_dir, job in sorted(self.jobs, key=lambda u: str(u[0]))
                                if job_dir not in self.restored)


def _jobs(plan: BuildPlan, target: BuildTarget, work: Path, cache: Path, jobs: int,
          extra_tasks: tuple[Task, ...], served: bool = False, tune: bool = False,
          variables: dict[str, str] | None = None) -> list[tuple[str, Path, Job]]:
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", WARMUP_THREADS: warmup_threads(len(plan_units(plan)), jobs),
           "TQDM_DISABLE": "1", **reproducible_cc(work),
           **candidates_env(target.capability, target.sm_count, {p.name: p.product for p in target.profiles}),
           **(variables or {})}
    builders = families.flashinfer("tasks")  # the paths whose tasks ask FlashInfer for its JIT modules
    asks = any(p in builders for p in plan.paths) or any(t.label in builders for t in extra_tasks)
    if asks and target.mode == "cross":
        env.update(flashinfer_build_env(target, build=not served))
    setup = ()
    if target.mode == "cross":
        product = target.profiles[0].product
        setup = (Task(f"{SAMPLER}:setup_platform", {"capability": target.capability, "sm_count": target.sm_count,
                                                     "product": product}, label="platform"),)
    units = plan_units(plan)
    if extra_tasks:
        units.append(("extra", tuple(extra_tasks)))
    out = []
    for name, tasks in units:
        if not tasks:
            continue
        job_dir = work / "jobs" / name
        job_dir.mkdir(parents=True, exist_ok=True)
        out.append((name, job_dir, Job(cache_dir=str(cache), compile_log=str(job_dir / "compiles.jsonl"),
                                       capability=target.capability, sm_count=target.sm_count, mode=target.mode,
                                       tasks=tasks, env=env, setup=setup, served=served, tune=tune)))
    return out


# vLLM's JIT warmup registry compiles its kernels from this many threads (``compile_triton_warmup``: a thread pool
# under Triton's ``AsyncCompileMode``; Triton's compiler releases the GIL, so threads use more cores).
WARMUP_THREADS = "VLLM_TRITON_JIT_WARMUP_NUM_THREADS"


def warmup_threads(processes: int, jobs: int) -> str:
    """The cores left to each of ``processes`` exercise processes (at most ``jobs`` at once)."""
    return str(max(1, (os.cpu_count() or 1) // max(1, min(jobs, processes))))


def _share_cores(units: list[tuple[str, Path, Job]], jobs: int, reuse: UnitReuse) -> list[tuple[str, Path, Job]]:
    """Units that a build-cache record will restore run no process: the cores go to the units that run (one new
    vocab of a warm build compiles from every core). The thread count is no input of a unit's outputs or key."""
    running = sum(1 for _, job_dir, job in units if reuse.expects_to_run(job_dir, job))
    threads = warmup_threads(running, jobs)
    return [(name, job_dir, replace(job, env={**job.env, WARMUP_THREADS: threads})) for name, job_dir, job in units]


_CC_WRAPPER = """#!/bin/sh
# kernelcache: Triton builds its launchers and cuda_utils from a random temp dir ($1 is the source),
# and cuda_utils.c's __FILE__ would put that dir in the .so; map it to "." so builds are reproducible.
exec "$KERNELCACHE_REAL_CC" "$@" "-ffile-prefix-map=${1%/*}=."
"""


def reproducible_cc(work: Path) -> dict[str, str]:
    """``CC`` for the exercise processes: the user's compiler (``CC``, else gcc, else clang) behind a
    wrapper that maps Triton's temp source dir away, so the same inputs give byte-identical modules."""
    real = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if not real:
        return {}  # Triton's own "Failed to find C compiler" then says what to do
    work.mkdir(parents=True, exist_ok=True)
    wrapper = work / "cc"
    wrapper.write_text(_CC_WRAPPER)
    wrapper.chmod(0o755)
    return {"CC": str(wrapper), "KERNELCACHE_REAL_CC": real}


def run_job(job_dir: Path, job: Job) -> WorkerResult:
    """Run one exercise process for ``job`` (its files in ``job_dir``); ``BuildFailed`` if a task failed."""
    path = job_dir / "job.json"
    path.write_text(job.to_json())
    with open(job_dir / "worker.log", "w", encoding="utf-8") as log:
        child = subprocess.Popen([sys.executable, "-m", "kernelcache.exercise.worker", str(path)],
                                 stdout=log, stderr=subprocess.STDOUT, env=_worker_env())
        _children.add(child)
        try:
            returncode = child.wait()
        finally:
            _children.discard(child)
    if returncode in (-signal.SIGINT, -signal.SIGTERM, 130):
        raise KeyboardInterrupt
    result_file = job_dir / "job.json.result"
    if not result_file.exists():
        raise BuildFailed(f"exercise process for {job_dir.name} died (exit {returncode}); "
                          f"see {job_dir / 'worker.log'}")
    result = WorkerResult.read(result_file)
    failed = [t for t in result.tasks if not t.ok]
    if failed:
        first = failed[0]
        if "SIGINT" in str(first.error):  # Ctrl-C reached the worker's compiler first
            raise KeyboardInterrupt
        raise BuildFailed(f"{job_dir.name}: task {first.label} failed: {first.error} "
                          f"(traceback in {result_file})")
    return result


_children: set[subprocess.Popen] = set()  # running exercise processes, stopped when the build is interrupted


def stop_exercises() -> None:
    """Stop every running exercise process (a build that failed or was interrupted)."""
    for child in list(_children):
        child.terminate()


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_CACHE_DIR", None)
    env.pop("TRITON_CACHE_MANAGER", None)
    return env


class UnitReuse(Protocol):
    """What a build may do instead of running a unit (buildcache/exercises.py ``UnitRecords``)."""

    def expects_to_run(self, job_dir: Path, job: Job) -> bool:
        """Whether the unit will likely run (no record of it is kept); asked before any unit starts."""

    def reuse(self, job_dir: Path, job: Job) -> bool:
        """Write the unit's log, result and cache entries into ``job_dir`` and its cache dir; True when it did."""

    def ran(self, job_dir: Path, job: Job, ok: bool) -> None:
        """The unit ran in ``job_dir`` (``ok``: its process succeeded)."""


def exercise(plan: BuildPlan, target: BuildTarget, work: Path, cache: Path, jobs: int,
             extra_tasks: tuple[Task, ...] = (), progress=None, served: bool = False, tune: bool = False,
             variables: dict[str, str] | None = None, reuse: UnitReuse | None = None,
             slots: threading.Semaphore | None = None) -> ExerciseRun:
    """Run the plan's paths for one target into ``cache``, ``jobs`` processes at a time (``served``: an installed
    cache, which Triton's gcc step may take helper modules from, as in a served process; ``tune``: the autotuner's
    timings and disk lookups logged; ``variables``: more environment for the exercise processes; ``reuse``: asked
    before each unit runs whether it can write the unit's outputs instead; ``slots``: shared by the targets of one
    build, at most that many exercise processes at once in all of them)."""
    units = _jobs(plan, target, work, cache, jobs, extra_tasks, served, tune, variables)
    if reuse is not None:
        units = _share_cores(units, jobs, reuse)
    cache.mkdir(parents=True, exist_ok=True)  # also when the plan has no Triton path (FlashInfer only)
    outcomes = _run_jobs(units, target, jobs, progress, reuse, slots)
    log = ExerciseLog.read(job.compile_log for _, _, job in sorted(units, key=lambda u: str(u[1])))
    restored = frozenset(job_dir for (_, job_dir, _), (_, reused) in zip(units, outcomes) if reused)
    return ExerciseRun(tuple(result for result, _ in outcomes), log, sum(len(job.tasks) for _, _, job in units),
                       tuple((job_dir, job) for _, job_dir, job in units), restored)


def _run_jobs(units, target: BuildTarget, jobs: int, progress, reuse: UnitReuse | None = None,
              slots: threading.Semaphore | None = None) -> list[tuple[WorkerResult, bool]]:
    """(result, restored) per unit, in ``units``' order. The model's layers start first: they sweep every token
    count and take longest, so the vocab units fill the other processes meanwhile."""
    done = 0
    if progress:
        progress(target.label, done, len(units))
    order = sorted(range(len(units)), key=lambda i: units[i][0] not in ("model", "extra"))
    results: dict[int, tuple[WorkerResult, bool]] = {}
    with ThreadPoolExecutor(max_workers=len(units) if slots else max(1, jobs)) as pool:
        futures = {pool.submit(_run_unit, units[i][1], units[i][2], reuse, slots): i for i in order}
        try:
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                done += 1
                if progress:
                    progress(target.label, done, len(units))
        except BaseException:
            for f in futures:
                f.cancel()
            stop_exercises()
            raise
    return [results[i] for i in range(len(units))]


def _run_unit(job_dir: Path, job: Job, reuse: UnitReuse | None,
              slots: threading.Semaphore | None) -> tuple[WorkerResult, bool]:
    if reuse is not None and reuse.reuse(job_dir, job):
        return WorkerResult.read(job_dir / "job.json.result"), True
    ok = False
    try:
        with slots or contextlib.nullcontext():
            result = run_job(job_dir, job)
        ok = True
    finally:
        if reuse is not None:
            reuse.ran(job_dir, job, ok)
    return result, False


def flashinfer_build_env(target: BuildTarget, build: bool = True) -> dict[str, str]:
    """The variables under which the flashinfer_attention task asks FlashInfer for its modules for the target (cross
    mode), in the kept FlashInfer workspace (exercise/flashinfer_sampling.py ``workspace_dir``), and (``build``: not
    when verifying) builds them."""
    from . import flashinfer_sampling as fi_build
    from .vllm_flashinfer import BUILD_VARIABLE, CC_VARIABLE

    return {**fi_build.build_variables(target.arch, fi_build.workspace_dir(), fi_build.nvcc_jobs(),
                                       fi_build.ensure_toolchain()), BUILD_VARIABLE: "1" if build else "0",
            CC_VARIABLE: os.environ.get("CC", "")}


def flashinfer_jit_module(plan: BuildPlan, target: BuildTarget, work: Path) -> tuple:
    """The ``sampling`` module vLLM's FlashInfer path JIT-built on the visible GPU (native mode)."""
    from . import flashinfer_sampling as fi_build

    base = work / "flashinfer-jit"
    job_dir = work / "jobs" / "flashinfer"
    job_dir.mkdir(parents=True, exist_ok=True)
    vocab = plan.vocabs[0].size
    job = Job(cache_dir=str(work / "cache"), compile_log=str(job_dir / "compiles.jsonl"), capability=target.capability,
              sm_count=target.sm_count, mode="native", prebuild=False,
              tasks=(Task(f"{SAMPLER}:flashinfer", {"vocab": vocab}, label="flashinfer"),),
              env={"FLASHINFER_WORKSPACE_BASE": str(base), "VLLM_USE_FLASHINFER_SAMPLER": "1"})
    run_job(job_dir, job)
    jit_dirs = sorted(base.glob(".cache/flashinfer/*/*/cached_ops"))
    if not jit_dirs:
        raise BuildFailed(f"vLLM's FlashInfer path built no JIT module under {base}")
    return (fi_build.harvest_sampling(jit_dirs[0], target.arch),)
