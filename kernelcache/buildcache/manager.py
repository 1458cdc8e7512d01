"""Triton's cache manager in a build's exercise processes: the build's ``TRITON_CACHE_DIR``, backed by the build cache.

Set as ``TRITON_CACHE_MANAGER`` (``knobs.cache.manager_class``, read by ``get_cache_manager`` in
triton/runtime/cache.py) with the cache's location in ``KERNELCACHE_BUILD_CACHE``. Triton asks every manager the
same four questions, and this one answers them as ``FileCacheManager`` does over the build's own directory,
adding:

* ``get_group(k.json)`` (``compile()`` looking for a kernel) when the directory lacks the group: the build
  cache's entry for the key, if it is a complete kernel whose files all match their sha256 and whose embedded
  paths are all this process's own, is written into the directory first (files, then the group last, as
  ``compile()`` writes them). ``compile()`` then finds a disk hit and calls its compile listener with
  ``cache_hit=True``, so the build's compile log (and with it the coverage and the manifest's kernel records)
  is what a build without the cache logs.
* ``get_file(name.so)`` (``triton.runtime.build`` looking for a launcher or ``cuda_utils``): the same for a
  helper module.
* ``put_group`` (a kernel compiled) and ``put`` of a ``.so`` (a module built): published to the build cache.
* ``get_file(name.so)`` answered by the directory itself: logged as ``present``, so the unit's exercise record
  (buildcache/exercises.py) names every helper module the unit used.

Overrides and dumps (``override=True``, ``dump=True``) are left to ``FileCacheManager``. A build cache that
fails (unreachable, full) never fails the build: the kernel is compiled, and the failure is logged. Every
outcome is one ``build_cache`` record in the compile log (``KERNELCACHE_COMPILE_LOG``), which the build counts.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from functools import lru_cache

from triton.runtime.cache import FileCacheManager

from ..format.compilelog import LOG_ENV, append
from . import ENV, resolve
from .blob import CorruptEntry, pack, unpack

_lock = threading.Lock()  # one store request at a time per process (vLLM's warmup compiles from threads)


class BuildCacheManager(FileCacheManager):
    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        self.shared = not (override or dump)

    def get_group(self, filename: str):
        found = super().get_group(filename)
        if found is None and self.shared and _restore(self, "kernel", filename):
            found = super().get_group(filename)
        return found

    def get_file(self, filename: str):
        found = super().get_file(filename)
        if found is not None and self.shared and _is_module(filename):
            _log(self.key, "present", "module")  # the unit used it: its exercise record names it
        elif found is None and self.shared and _is_module(filename) and _restore(self, "module", filename):
            found = super().get_file(filename)
        return found

    def put(self, data, filename: str, binary: bool = True) -> str:
        path = super().put(data, filename, binary)
        if self.shared and _is_module(filename):
            _publish(self.key, "module", None, {filename: data if isinstance(data, bytes) else str(data).encode()})
        return path

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        path = super().put_group(filename, group)
        if self.shared:
            files = {}
            for name, child in group.items():
                with open(child, "rb") as handle:
                    files[os.path.basename(name)] = handle.read()
            _publish(self.key, "kernel", filename, files)
        return path


def _restore(manager: FileCacheManager, kind: str, filename: str) -> bool:
    """Write the build cache's entry for ``manager.key`` into the build's directory; False if it has none to give."""
    found = _fetch(manager.key, kind)
    if found is None:
        return False
    entry, files = found
    if entry.kind != kind or (entry.group != filename if kind == "kernel" else filename not in files):
        _log(manager.key, "mismatch", kind, f"the entry holds {entry.group or ', '.join(files)}, not {filename}")
        return False
    written = {name: FileCacheManager.put(manager, data, name) for name, data in files.items()}
    if kind == "kernel":
        FileCacheManager.put_group(manager, filename, written)  # the group last: Triton's commit marker
    _log(manager.key, "hit", kind)
    return True


def _fetch(key: str, kind: str):
    """(entry, files) for ``key`` when the build cache has a good one that is this process's to use, else None."""
    try:
        with _lock:
            blobs = _store().get(key)
    except CorruptEntry as exc:
        _log(key, "corrupt", kind, str(exc))
        return None
    except Exception as exc:  # noqa: BLE001 -- the store failed: compile instead, and say so
        _log(key, "error", kind, f"reading: {type(exc).__name__}: {exc}")
        return None
    foreign = None
    for blob in blobs:
        try:
            entry, files = unpack(blob, key)
        except CorruptEntry as exc:
            _log(key, "corrupt", kind, str(exc))
            continue
        elsewhere = [p for p in entry.paths if not own_path(p)]
        if not elsewhere:
            return entry, files
        foreign = foreign or elsewhere[0]
    if foreign:
        _log(key, "foreign", kind, f"embeds {foreign}")
    return None


def _publish(key: str, kind: str, group: str | None, files: dict[str, bytes]) -> None:
    try:
        entry, blob = pack(key, kind, group, files)
        with _lock:
            _store().put(key, entry.variant, blob)
    except Exception as exc:  # noqa: BLE001 -- the kernel is compiled; only the cache missed out
        _log(key, "error", kind, f"writing: {type(exc).__name__}: {exc}")
        return
    _log(key, "published", kind)


@lru_cache(maxsize=1)
def _store():
    from . import open_store

    spec = resolve(os.environ.get(ENV) or False)
    if spec is None:
        raise RuntimeError(f"TRITON_CACHE_MANAGER is {__name__} but {ENV} names no build cache")
    return open_store(spec)


def _is_module(filename: str) -> bool:
    return filename.endswith(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def own_path(path: str) -> bool:
    """Whether ``path`` lies where this process's code comes from: under its interpreter's installation (and
    venv), or under the directory a loaded top-level module or package was imported from (its sys.path entry).
    A path of another install is not."""
    path = os.path.normpath(path)
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in _roots(len(sys.modules)))


@lru_cache(maxsize=4)
def _roots(_loaded: int) -> tuple[str, ...]:
    """The directories this process's loaded top-level modules came from (recomputed as more modules load)."""
    roots = {os.path.normpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p != "/"}
    for name, module in list(sys.modules.items()):
        if "." in name:
            continue
        where = getattr(module, "__file__", None)
        folders = [os.path.dirname(where)] if where else []
        if where and os.path.basename(where).startswith("__init__."):
            folders = [os.path.dirname(folders[0])]
        folders += [os.path.dirname(p) for p in getattr(module, "__path__", None) or () if not where]
        roots.update(os.path.normpath(f) for f in folders if f and os.path.isabs(f) and f != "/")
    return tuple(sorted(roots))


def _log(key: str, outcome: str, kind: str, detail: str | None = None) -> None:
    target = os.environ.get(LOG_ENV)
    if target:
        append(target, {"event": "build_cache", "outcome": outcome, "kind": kind, "key": key, "detail": detail,
                        "task": os.environ.get("KERNELCACHE_TASK"), "pid": os.getpid(), "time": time.time()})
