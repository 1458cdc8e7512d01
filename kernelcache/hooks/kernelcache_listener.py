"""Record every Triton ``compile()`` call -- disk hit or real compile -- and every gcc build of a helper module as
one JSON line of the compile log (standard library only: ``sitecustomize`` installs it in the processes
``kernelcache capture`` starts; exercise/worker.py, in the exercise's workers).

``triton.knobs.compilation.listener`` is called on every compile, hit or miss, with the source (signature,
constexprs, attrs), the metadata (hash, num_warps, ...) and ``cache_hit`` (``compile`` in
triton/compiler/compiler.py). Triton's own metadata file keeps no signature or constexprs, so this log is where the
bundle manifest gets them (format/compilelog.py reads it back).
"""

from __future__ import annotations

import base64
import math
import os
import threading
import time

try:
    from . import kernelcache_records  # imported as kernelcache.hooks.kernelcache_listener
except ImportError:
    import kernelcache_records  # imported from the served site dir

LOG_ENV = "KERNELCACHE_COMPILE_LOG"
_lock = threading.Lock()


def append(path: str, record: dict) -> None:
    """One record appended to the compile log at ``path`` (kernelcache_records.append_line)."""
    with _lock:
        kernelcache_records.append_line(path, record)


def base32_key(hash_hex: str) -> str:
    """The cache directory name Triton derives from a metadata hash."""
    return base64.b32encode(bytes.fromhex(hash_hex)).decode().rstrip("=")


def json_value(value):
    """A JSON-safe form of a constexpr value: non-finite floats and odd objects become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


def event(src, metadata: dict, cache_hit: bool, times) -> dict:
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
        "constexprs": {_param(names, k): json_value(v) for k, v in constants.items()},
        "attrs": {_param(names, k): v for k, v in attrs.items() if v},
        "compile_us": getattr(times, "total", None),
        "task": os.environ.get("KERNELCACHE_TASK"),
        "pid": os.getpid(),
        "time": time.time(),
    }


def install(path: str | None = None, also=None):
    """Record to ``path`` (default: $KERNELCACHE_COMPILE_LOG) and hand each record to ``also``: a recording listener
    chained in front of whatever listener Triton already has."""
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


def count_builds(path: str | None = None, also=None) -> None:
    """Log every gcc build of a Triton helper module (launchers, cuda_utils) to ``path`` (default:
    $KERNELCACHE_COMPILE_LOG) and hand each record to ``also``: a cache miss too. A module the installed cache
    answered (kernelcache_prebuilt.py) is logged as ``prebuilt`` instead. A record: ``{"event": "gcc" | "prebuilt",
    "name", "seconds", "pid", "time", "task"}``. The one place that wraps Triton's ``triton.runtime.build._build``:
    scripts count builds with ``also``, never by patching Triton themselves."""
    from triton.runtime import build

    try:
        from . import kernelcache_prebuilt  # imported as kernelcache.hooks.kernelcache_listener
    except ImportError:
        import kernelcache_prebuilt  # imported from the served site dir

    target = path or os.environ.get(LOG_ENV)
    original = build._build

    def counted(name, src, srcdir, *args, **kwargs):
        started = time.perf_counter()
        so = original(name, src, srcdir, *args, **kwargs)
        if target or also is not None:
            event = "prebuilt" if kernelcache_prebuilt.served_by_cache(so) else "gcc"
            record = {"event": event, "name": name, "seconds": time.perf_counter() - started, "pid": os.getpid(),
                      "time": time.time(), "task": os.environ.get("KERNELCACHE_TASK")}
            if target:
                append(target, record)
            if also is not None:
                also(record)
        return so

    build._build = counted


def _param(names: list[str], index) -> str:
    if isinstance(index, tuple) and len(index) == 1 and isinstance(index[0], int) and index[0] < len(names):
        return names[index[0]]
    return str(index)
