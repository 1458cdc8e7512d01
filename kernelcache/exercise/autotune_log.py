"""Record what Triton's autotuner did: each candidate it timed, and each disk lookup of its choices.

Triton's ``Autotuner`` (triton/runtime/autotuner.py) times a candidate config in ``_bench`` (one call per config,
through the benchmarker) and, with its disk cache on, looks a tuning key up in ``check_disk_cache``: True when
``<key dir>/<kernel>.autotune.json`` answered (nothing timed), False when it timed the candidates and wrote the
file. ``install`` wraps both at class level and appends one JSON line per event to the compile log
(hooks/kernelcache_listener.py's format): ``{"event": "autotune_bench", "kernel", "config"}`` per candidate timed and
``{"event": "autotune", "kernel", "dir", "file", "hit", "key"}`` per lookup. ``tune`` takes its choices from the
lookups, and the GPU proofs count benchmark runs from the first.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

_where = threading.local()  # the key dir check_disk_cache's cache manager was made for, per thread


def install(path: str | None = None, also: Callable[[dict], None] | None = None) -> None:
    """Record to ``path`` (default: $KERNELCACHE_COMPILE_LOG) and hand each record to ``also``. Once per process."""
    from triton.runtime import autotuner

    from ..format.compilelog import LOG_ENV, append

    tuner = autotuner.Autotuner
    if getattr(tuner._bench, "kernelcache_logged", False):
        return
    target = path or os.environ.get(LOG_ENV)

    def record(data: dict) -> None:
        data.update(pid=os.getpid(), time=time.time(), task=os.environ.get("KERNELCACHE_TASK"))
        if target:
            append(target, data)
        if also is not None:
            also(data)

    _wrap_bench(tuner, record)
    _wrap_lookup(autotuner, record)


def _wrap_bench(tuner, record: Callable[[dict], None]) -> None:
    original = tuner._bench

    def _bench(self, *args, config, **meta):
        record({"event": "autotune_bench", "kernel": self.base_fn.__name__, "config": str(config)})
        return original(self, *args, config=config, **meta)

    _bench.kernelcache_logged = True
    tuner._bench = _bench


def _wrap_lookup(module, record: Callable[[dict], None]) -> None:
    tuner, original, managers = module.Autotuner, module.Autotuner.check_disk_cache, module.get_cache_manager

    def get_cache_manager(key):
        found = managers(key)
        _where.dir = getattr(found, "key", None)  # FileCacheManager's key: the dir name (base32)
        return found

    def check_disk_cache(self, tuning_key, configs, bench_fn):
        _where.dir = None
        hit = original(self, tuning_key, configs, bench_fn)
        name = function_name(self)
        record({"event": "autotune", "kernel": name, "dir": _where.dir, "file": f"{name[:150]}.autotune.json",
                "hit": bool(hit), "key": str(tuning_key)})
        return hit

    module.get_cache_manager = get_cache_manager
    tuner.check_disk_cache = check_disk_cache


def function_name(tuner) -> str:
    """The JIT function's name, as ``check_disk_cache`` names the file (it unwraps heuristics, too)."""
    from triton.runtime.jit import JITFunction

    fn = tuner.fn
    while not isinstance(fn, JITFunction):
        fn = fn.fn
    return fn.__name__
