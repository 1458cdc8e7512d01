"""A miss log (from the read-only overlay) -> replayable build targets and exercise tasks.

Each ``kind: kernel`` record of ``<overlay>/.kernelcache/misses.jsonl`` names a JIT function
(module and qualname), the target it was compiled for, and Triton's ``specialization_data``.
``read`` keeps one target per cache key; records it cannot replay (no specialization: the
compile listener did not see them) are reported as skipped with the reason. Launcher and
``cuda_utils`` misses need no target of their own: replaying a kernel in a build worker rebuilds
its launcher. ``replay_tasks`` turns a log into the worker ``Task`` list for one target arch:

    from kernelcache.plan.misses import replay_tasks
    tasks = replay_tasks("misses.jsonl", capability=90)   # [Task("kernelcache.exercise.replay:run", ...)]
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import asdict, dataclass

from ..errors import UsageError
from ..hooks.kernelcache_records import records as log_records
from .tasks import Task

REPLAY = "kernelcache.exercise.replay:run"


@dataclass(frozen=True)
class MissTarget:
    """One kernel specialization to compile again."""

    kernel: str
    key: str  # the cache key the miss had; replaying must reproduce it
    capability: int  # 90 for sm_90
    fn_module: str
    fn_qualname: str
    specialization_data: str  # Triton's JSON, as JITFunction.preload takes it

    def to_record(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MissLog:
    targets: tuple[MissTarget, ...]
    skipped: tuple[dict, ...]  # {"key", "kernel", "reason"}
    modules: int  # launcher / cuda_utils misses (rebuilt with their kernels)
    records: int  # lines read

    @property
    def capabilities(self) -> list[int]:
        return sorted({t.capability for t in self.targets})


def read(path: str | os.PathLike) -> MissLog:
    """Parse a miss log; a torn last line (a killed writer) is ignored."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read miss log {path}: {exc.strerror or exc}") from None
    targets: dict[str, MissTarget] = {}
    skipped: dict[str, dict] = {}
    modules = records = 0
    for record in log_records(lines):
        records += 1
        if record.get("kind") != "kernel":
            modules += record.get("kind") == "module"
            continue
        target, reason = _target(record)
        if target is not None:
            targets.setdefault(target.key, target)
            skipped.pop(target.key, None)
        elif record.get("key") not in targets:
            skipped[str(record.get("key"))] = {"key": record.get("key"), "kernel": record.get("kernel"),
                                               "reason": reason}
    if any(line.strip() for line in lines) and not records:
        raise UsageError(f"{path} is not a kernelcache miss log: none of its {len(lines)} line(s) is a JSON record")
    ordered = tuple(sorted(targets.values(), key=lambda t: (t.capability, t.kernel, t.key)))
    return MissLog(ordered, tuple(skipped.values()), modules, records)


def _target(record: dict) -> tuple[MissTarget | None, str]:
    if not record.get("specialization_data"):
        return None, record.get("why") or "no specialization recorded"
    target = record.get("target") or {}
    if not isinstance(target, dict) or target.get("backend") != "cuda" or not isinstance(target.get("arch"), int):
        return None, f"target {target!r} is not a CUDA arch"
    if not record.get("fn_module") or not record.get("fn_qualname"):
        return None, "the JIT function's module or qualname is unknown"
    return MissTarget(kernel=str(record.get("kernel")), key=str(record["key"]), capability=target["arch"],
                      fn_module=record["fn_module"], fn_qualname=record["fn_qualname"],
                      specialization_data=record["specialization_data"]), ""


def tasks_by_capability(path: str | os.PathLike) -> dict[int, list[Task]]:
    """One replay task per target arch found in the log."""
    grouped: dict[int, list[MissTarget]] = defaultdict(list)
    for target in read(path).targets:
        grouped[target.capability].append(target)
    return {cap: [_task(found, path)] for cap, found in sorted(grouped.items())}


def replay_tasks(path: str | os.PathLike, capability: int) -> list[Task]:
    """The tasks that make a build worker for ``sm_<capability>`` compile the log's misses (maybe none)."""
    return tasks_by_capability(path).get(capability, [])


def _task(targets: list[MissTarget], path: str | os.PathLike) -> Task:
    return Task(REPLAY, {"records": [t.to_record() for t in targets]},
                label=f"replay {len(targets)} misses from {os.path.basename(str(path))}")
