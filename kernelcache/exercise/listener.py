"""Record every Triton ``compile()`` call -- disk hit or real compile -- as one JSON line.

``triton.knobs.compilation.listener`` is called on every compile, hit or miss, with the source
(signature, constexprs, attrs), the metadata (hash, num_warps, ...) and ``cache_hit``
(``compile`` in triton/compiler/compiler.py). Triton's own metadata file keeps no signature or
constexprs, so this log is where the bundle manifest gets them, where ``verify`` counts compiles,
and where the overlay's miss log comes from. The log's records, its appender and its readers are the ground
floor's (format/compilelog.py); this module hooks Triton to write them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from ..format.cachekey import base32_key
from ..format.compilelog import LOG_ENV, CompileRecord, ExerciseLog, append, compiles, read

# The compile log's records and readers live on the ground floor (format/compilelog.py); their old names stay here.
__all__ = ["LOG_ENV", "CompileRecord", "ExerciseLog", "append", "base32_key", "compiles", "count_builds", "event",
           "install", "read"]


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


def _param(names: list[str], index: Any) -> str:
    if isinstance(index, tuple) and len(index) == 1 and isinstance(index[0], int) and index[0] < len(names):
        return names[index[0]]
    return str(index)


def _value(value: Any) -> Any:
    from ..format.manifest import json_value

    return json_value(value)
