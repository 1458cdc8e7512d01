"""Triton's autotune cache for a served process whose installed bundle carries choices, with the read guarded.

Triton's autotuner keeps what it timed when ``knobs.autotuning.cache`` (``TRITON_CACHE_AUTOTUNING=1``) or
``autotune(cache_results=True)`` is on: ``Autotuner.check_disk_cache``
(https://github.com/triton-lang/triton/blob/main/python/triton/runtime/autotuner.py) hashes ``triton_key()``,
the backend, the kernel's source key, the set cache-invalidating variables, the tuning key and every candidate
config into a cache key and looks for ``<key>/<kernel>.autotune.json``. On a hit it takes the config with the
least time and times nothing; on a miss it times every candidate and writes the file. The variable is in no
kernel's cache key (``get_cache_invalidating_env_vars()`` leaves it out, Triton 3.6 and 3.8), and it is read
when a kernel is decorated, so ``kernelcache env`` / ``run`` / ``activate()`` set it before the served process
starts (vLLM's env_override.py sets it too, unless the user set it to 0).

Triton reads the file with ``json.load`` and ``Config(**config)`` and takes ``min`` of the timings, unguarded:
a file that is not JSON, not of that shape, or has no timings raises out of the kernel's launch. ``guard``
wraps the file lookup of ``check_disk_cache`` so that such a file, or one naming a config that is not among the
candidates Triton hashed into its key, is a miss: Triton times the candidates as it would without the file and
writes a good one in its place; one line on stderr names the file. Standard library only, and Triton, once
the process imports it.
"""

from __future__ import annotations

import contextvars
import sys

SUFFIX = ".autotune.json"  # the file check_disk_cache reads and writes: <fn.__name__[:150]>.autotune.json
MODULE = "triton.runtime.autotuner"
ENV_VAR = "KERNELCACHE_AUTOTUNE_CHECK"  # set by env / run / activate() where an installed bundle has choices
_candidates: contextvars.ContextVar = contextvars.ContextVar("kernelcache_autotune_candidates", default=None)


def environment() -> dict[str, str]:
    """The variables that turn Triton's autotune cache on, and this guard with it (the site dir goes on
    PYTHONPATH too: the caller's job)."""
    return {"TRITON_CACHE_AUTOTUNING": "1", ENV_VAR: "1"}


def guard(module) -> None:
    """Wrap ``module`` (``triton.runtime.autotuner``): its ``check_disk_cache`` and the cache manager it reads
    with. Once per module."""
    tuner = module.Autotuner
    if getattr(tuner.check_disk_cache, "kernelcache_guarded", False):
        return
    original, managers = tuner.check_disk_cache, module.get_cache_manager

    def check_disk_cache(self, tuning_key, configs, bench_fn):
        token = _candidates.set((module.Config, {str(c) for c in configs}))
        try:
            return original(self, tuning_key, configs, bench_fn)
        finally:
            _candidates.reset(token)

    def get_cache_manager(key):
        found = managers(key)
        return Checked(found) if _candidates.get() is not None else found

    check_disk_cache.kernelcache_guarded = True
    check_disk_cache.__wrapped__ = original
    tuner.check_disk_cache = check_disk_cache
    module.get_cache_manager = get_cache_manager


class Checked:
    """A cache manager whose ``get_file`` answers an autotune file only when Triton can use it."""

    def __init__(self, manager):
        self.manager = manager

    def __getattr__(self, name):
        return getattr(self.manager, name)

    def get_file(self, filename):
        path = self.manager.get_file(filename)
        if path is None or not filename.endswith(SUFFIX):
            return path
        config, candidates = _candidates.get()
        problem = unusable(path, config, candidates)
        if problem is None:
            return path
        print(f"kernelcache: {path}: {problem}; Triton times the candidates again", file=sys.stderr)
        return None


def unusable(path: str, config, candidates: set[str] | None = None) -> str | None:
    """Why Triton could not use the autotune file at ``path`` (its read, redone), or None: it parses as JSON,
    its ``configs_timings`` pairs build ``config`` objects (all among ``candidates``, their ``str`` as Triton's key
    holds them, when given), and ``min`` over their timings works."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            pairs = json.load(handle)["configs_timings"]
        timings = {config(**settings): timing for settings, timing in pairs}
        min(timings, key=timings.get)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"unreadable autotune file ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
    stray = sorted(str(c) for c in timings if candidates is not None and str(c) not in candidates)
    if stray:
        return f"names a config the kernel does not list ({stray[0]})"
    return None


def guard_on_import() -> None:
    """Guard this process: now if Triton's autotuner is imported, else when it is (once)."""
    import importlib

    module = sys.modules.get(MODULE)
    if module is not None:
        guard(module)
        return
    hooks = importlib.import_module(f"{__package__}.kernelcache_tritonkey" if __package__ else "kernelcache_tritonkey")
    if not any((getattr(f, "name", None), getattr(f, "tag", None)) == (MODULE, "autotune") for f in sys.meta_path):
        sys.meta_path.insert(0, hooks.AfterImport(MODULE, guard, "autotune"))
