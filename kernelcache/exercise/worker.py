"""One exercise process: a fresh TRITON_CACHE_DIR, a real or fake target, one list of tasks.

Run as ``python -m kernelcache.exercise.worker JOB.json``. The job names the cache dir, the compile
log, the target (capability, SM count) and whether it is real (``native``) or faked (``cross``).
Everything that decides a cache key is set here, in this order, before Triton is imported:
environment, then the active driver, then (for vLLM) the platform, then the kernels run.
The result (task outcomes, counts) is written as JSON to ``JOB.json.result``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

from ..plan.tasks import Task


@dataclass(frozen=True)
class Job:
    cache_dir: str
    compile_log: str
    capability: int
    sm_count: int
    mode: str  # "cross" | "native"
    tasks: tuple[Task, ...]
    prebuild: bool = True  # launchers and cuda_utils
    env: dict = field(default_factory=dict)  # extra variables, set before import
    setup: tuple[Task, ...] = ()  # run after the driver is active, before the tasks (e.g. vLLM's platform)
    served: bool = False  # an installed cache (verify): Triton's gcc step takes its helper modules, as when served
    tune: bool = False  # log what Triton's autotuner timed and looked up (exercise/autotune_log.py)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Job:
        data = json.loads(text)
        data["tasks"] = tuple(Task(**t) for t in data["tasks"])
        data["setup"] = tuple(Task(**t) for t in data.get("setup", ()))
        return cls(**data)


def main(path: str) -> int:
    with open(path, encoding="utf-8") as handle:
        job = Job.from_json(handle.read())
    os.environ["TRITON_CACHE_DIR"] = job.cache_dir
    os.environ.update(job.env)
    os.environ["KERNELCACHE_TARGET_MODE"] = job.mode
    os.environ["KERNELCACHE_COMPILE_LOG"] = job.compile_log  # where hooks record too (a build cache's manager)
    if job.mode == "cross":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # vllm.triton_utils.importing: 0 drivers, Triton kept
    started = time.perf_counter()
    results, functions = [], set()

    from ..hooks import kernelcache_listener
    from . import device_tables

    kernelcache_listener.install(job.compile_log)
    device_tables.start(job.compile_log)
    if job.served:
        _served_helpers(job.cache_dir)
    kernelcache_listener.count_builds(job.compile_log)
    if job.tune:
        from . import autotune_log

        autotune_log.install(job.compile_log)
    _track_functions(functions)
    if job.mode == "cross":
        from . import fake_target

        fake_target.activate(job.capability, job.sm_count, prebuild=job.prebuild)
    failed = False
    for task in job.setup:
        results.append(_run_task(task))
        if not results[-1]["ok"]:
            return _finish(path, results, 0, started, True, job.capability)
    launchers = 0
    for task in job.tasks:
        results.append(_run_task(task))
        failed = failed or not results[-1]["ok"]
        try:
            launchers += _between_tasks(job, functions)
        except Exception as exc:  # noqa: BLE001 -- a launcher that cannot be built fails the task's job
            results.append({"label": f"{task.label or task.call} (launchers)", "ok": False,
                            "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
            failed = True
    walks = _walks(functions) if not (failed or job.served) else None  # verify's processes carry none
    return _finish(path, results, launchers, started, failed, job.capability, walks)


def _finish(path: str, results: list, launchers: int, started: float, failed: bool, capability: int = 0,
            walks: dict | None = None) -> int:
    outcome = {"ok": not failed, "tasks": results, "launchers_initialised": launchers,
               "seconds": time.perf_counter() - started, "environment": _environment(capability),
               "triton_identity": _identity(capability), "walks": walks}
    with open(path + ".result", "w", encoding="utf-8") as handle:
        json.dump(outcome, handle, indent=1, default=str)
    return 0 if not failed else 1


def _between_tasks(job: Job, functions: set) -> int:
    """Build the launchers of what the task compiled, then forget the in-memory kernels, so the next
    task's launches go through ``compile()`` again (disk hits) and the log attributes them to it."""
    count = 0
    if job.prebuild:  # native mode: the real driver builds and loads them, as at first launch
        from . import fake_target

        count = fake_target.prebuild_launchers(functions)
    for fn in functions:
        fn.device_caches.clear()
    return count


def _walks(functions: set) -> dict | None:
    """The record of Triton's dependency walks of the kernels this process ran and their callees, which the bundle
    carries for served processes to replay (hooks/kernelcache_walks.py); None where this Triton's walk is not one
    the replay supports."""
    import triton.runtime.jit as jit

    from ..hooks import kernelcache_walks

    try:
        return kernelcache_walks.walk_records(jit, functions)
    except Exception as exc:  # noqa: BLE001 -- a walk Triton itself refuses now: the bundle carries no record
        print(f"kernelcache: no walk records: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def _served_helpers(cache_dir: str) -> None:
    """Let Triton's gcc step take the installed cache's helper modules as a served process does
    (hooks/kernelcache_prebuilt.py); the build counter, set after, logs them as such."""
    from triton.runtime import build

    from ..hooks import kernelcache_prebuilt

    kernelcache_prebuilt.activate(build, cache_dir)


def _environment(capability: int) -> dict | None:
    """The fingerprint as this process saw it while compiling (None if Triton is unusable)."""
    from dataclasses import asdict

    from ..format.fingerprint import local_environment

    try:
        return asdict(local_environment([f"sm_{capability}"]))
    except Exception:  # noqa: BLE001 -- reported as missing; the parent refuses to bundle then
        return None


def _identity(capability: int) -> dict | None:
    """This process's Triton by content (format/identity.py), for installs to fingerprint without Triton."""
    from dataclasses import asdict

    from ..format.identity import identity_here

    found = identity_here([f"sm_{capability}"])
    return asdict(found) if found else None


def _run_task(task: Task) -> dict:
    module_name, _, func_name = task.call.partition(":")
    os.environ["KERNELCACHE_TASK"] = task.label or task.call
    started = time.perf_counter()
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        summary = func(**task.kwargs)
        return {"label": task.label or task.call, "ok": True, "summary": summary,
                "seconds": time.perf_counter() - started}
    except Exception as exc:  # noqa: BLE001 -- reported to the parent, which decides
        return {"label": task.label or task.call, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(), "seconds": time.perf_counter() - started}


def _track_functions(functions: set) -> None:
    """Remember every JITFunction that compiled, to build its launchers afterwards."""
    import triton

    previous = triton.knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        fn = getattr(src, "fn", None)
        if fn is not None:
            functions.add(fn)
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    triton.knobs.compilation.listener = listener


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
