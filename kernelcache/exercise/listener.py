"""Record every Triton ``compile()`` call -- disk hit or real compile -- as one JSON line.

``triton.knobs.compilation.listener`` is called on every compile, hit or miss, with the source
(signature, constexprs, attrs), the metadata (hash, num_warps, ...) and ``cache_hit``
(``compile`` in triton/compiler/compiler.py). Triton's own metadata file keeps no signature or
constexprs, so this log is where the bundle manifest gets them, where ``verify`` counts compiles,
and where the overlay's miss log comes from. Lines are appended with one ``write`` each, so
threads and processes can share one log.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LOG_ENV = "KERNELCACHE_COMPILE_LOG"
_lock = threading.Lock()


def base32_key(hash_hex: str) -> str:
    """The cache directory name Triton derives from a metadata hash."""
    import base64

    return base64.b32encode(bytes.fromhex(hash_hex)).decode().rstrip("=")


def event(src: Any, metadata: dict, cache_hit: bool, times: Any) -> dict:
    names = list(getattr(src, "signature", {}) or {})
    signature = dict(getattr(src, "signature", {}) or {})
    constants = getattr(src, "constants", {}) or {}
    attrs = getattr(src, "attrs", {}) or {}
    return {
        "event": "compile",
        "name": getattr(src, "name", None) or metadata.get("name"),
        "key": base32_key(metadata["hash"]),
        "cache_hit": bool(cache_hit),
        "arch": getattr(metadata.get("target"), "arch", None),
        "num_warps": metadata.get("num_warps"),
        "num_stages": metadata.get("num_stages"),
        "signature": signature,
        "constexprs": {_param(names, k): _value(v) for k, v in constants.items()},
        "attrs": {_param(names, k): v for k, v in attrs.items() if v},
        "compile_us": getattr(times, "total", None),
        "task": os.environ.get("KERNELCACHE_TASK"),
        "pid": os.getpid(),
        "time": time.time(),
    }


def install(path: str | None = None, also: Callable[[dict], None] | None = None) -> Callable:
    """Record to ``path`` (default: $KERNELCACHE_COMPILE_LOG) and hand each record to ``also``."""
    """Chain a recording listener in front of whatever listener Triton already has."""
    import triton

    target = path or os.environ.get(LOG_ENV)
    previous = triton.knobs.compilation.listener

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        record = event(src, metadata, cache_hit, times)
        if target:
            append(target, record)
        if also is not None:
            also(record)
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    triton.knobs.compilation.listener = listener
    return listener


def count_builds(path: str | None = None) -> None:
    """Log every gcc build of a Triton helper module (launchers, cuda_utils): a cache miss too. A module the
    installed cache answered (runtime/site/kernelcache_prebuilt.py) is logged as ``prebuilt`` instead."""
    from triton.runtime import build

    from ..runtime.site import kernelcache_prebuilt

    target = path or os.environ.get(LOG_ENV)
    original = build._build

    def counted(name, src, srcdir, *args, **kwargs):
        started = time.perf_counter()
        so = original(name, src, srcdir, *args, **kwargs)
        if target:
            event = "prebuilt" if kernelcache_prebuilt.served_by_cache(so) else "gcc"
            append(target, {"event": event, "name": name, "seconds": time.perf_counter() - started,
                            "pid": os.getpid(), "time": time.time(), "task": os.environ.get("KERNELCACHE_TASK")})
        return so

    build._build = counted


def append(path: str, record: dict) -> None:
    line = (json.dumps(record, default=str) + "\n").encode()
    with _lock:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


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
    """All complete records of a log (a torn last line from a killed writer is skipped)."""
    records = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    records.append(record)
    except FileNotFoundError:
        pass
    return records


def _param(names: list[str], index: Any) -> str:
    if isinstance(index, tuple) and len(index) == 1 and isinstance(index[0], int) and index[0] < len(names):
        return names[index[0]]
    return str(index)


def _value(value: Any) -> Any:
    from ..format.manifest import json_value

    return json_value(value)
