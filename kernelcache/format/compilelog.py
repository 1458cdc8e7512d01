"""The compile log: one JSON line per Triton ``compile()`` call (a disk hit or a real compile) and per gcc build of
a helper module, with the records read back from it. The compile listener (hooks/kernelcache_listener.py) and the build
cache write it; harvest, pack, verify and the overlay's miss log read it. Lines are appended with one ``write``
each, so threads and processes can share one log, and a reader skips the torn last line of a killed writer."""

from __future__ import annotations

from dataclasses import dataclass

from ..hooks.kernelcache_listener import LOG_ENV as LOG_ENV  # the writer is the served hook's: one lock, one format
from ..hooks.kernelcache_listener import append as append
from ..hooks.kernelcache_records import read_lines


@dataclass(frozen=True)
class CompileRecord:
    """One ``compile()`` call as the listener logged it: a disk hit (``cache_hit``) or a real compile."""

    name: str
    key: str  # the Triton cache dir the kernel lives in
    cache_hit: bool
    task: str | None = None  # the exercise task that asked for it
    signature: dict | None = None
    constexprs: dict | None = None
    attrs: dict | None = None
    compile_us: float | None = None

    @classmethod
    def from_dict(cls, data: dict) -> CompileRecord:
        return cls(str(data.get("name")), str(data["key"]), bool(data.get("cache_hit")), data.get("task"),
                   data.get("signature"), data.get("constexprs"), data.get("attrs"), data.get("compile_us"))


@dataclass(frozen=True)
class ExerciseLog:
    """What exercise processes logged: every compile() call and every gcc build of a helper module."""

    compiles: tuple[CompileRecord, ...] = ()
    gcc_builds: tuple[str, ...] = ()  # module names (__triton_launcher, cuda_utils)
    prebuilt: tuple[str, ...] = ()  # module names whose build the installed cache answered
    device_tables: tuple[dict, ...] = ()  # device-keyed table lookups (exercise/device_tables.py)
    autotune: tuple[dict, ...] = ()  # the autotuner's disk lookups and candidates timed (exercise/autotune_log.py)
    build_cache: tuple[dict, ...] = ()  # what the build cache gave or took (buildcache/manager.py)

    @classmethod
    def read(cls, paths) -> ExerciseLog:
        """The logs at ``paths``, in order (torn last lines skipped), parsed once."""
        records = [r for path in paths for r in read(str(path))]
        names = {event: tuple(str(r.get("name")) for r in records if r.get("event") == event)
                 for event in ("gcc", "prebuilt")}
        tables = tuple(r for r in records if r.get("event") == "device_table")
        tuned = tuple(r for r in records if r.get("event") in ("autotune", "autotune_bench"))
        cache = tuple(r for r in records if r.get("event") == "build_cache")
        return cls(tuple(CompileRecord.from_dict(r) for r in compiles(records)), names["gcc"], names["prebuilt"],
                   tables, tuned, cache)


def compiles(records: list[dict]) -> list[dict]:
    """Only the compile() records of a log (not the gcc builds)."""
    return [r for r in records if r.get("event", "compile") == "compile" and "key" in r]


def read(path: str) -> list[dict]:
    """All complete records of a log (a torn last line from a killed writer is skipped); none when it is absent."""
    try:
        return read_lines(path)
    except FileNotFoundError:
        return []
