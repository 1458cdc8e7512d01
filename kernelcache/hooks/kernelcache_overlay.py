"""A Triton cache manager: hits from a read-only base, misses into a writable overlay, each miss logged.

Set by ``kernelcache env --read-only`` / ``kernelcache run --read-only``:

    TRITON_CACHE_MANAGER=kernelcache_overlay:OverlayCacheManager
    TRITON_CACHE_DIR=<overlay>          where misses are written (a plain Triton cache dir)
    KERNELCACHE_BASE_DIR=<base>         the read-only installed cache (image layer, ROX volume)
    KERNELCACHE_MISS_LOG=<file.jsonl>   one JSON line per miss
    PYTHONPATH=<this directory>:...     so Triton can import this module, and sitecustomize runs

This file lives in ``kernelcache/hooks/`` and needs only the standard library and Triton,
so the served interpreter does not need kernelcache installed.

Lookups never write. A group file in the base may hold absolute paths of wherever the cache was
installed (an image layer mounted elsewhere); children are found by basename inside the entry
directory instead, and an entry whose children are not all there is a miss, never a half hit.
Everything a miss compiles is written to the overlay the way Triton writes (a temporary dir, then
``os.replace``, the group file last).

The miss log gets one record per kernel Triton had to compile (``kind: kernel``) and per gcc-built
module or autotune file it had to write (``kind: module`` / ``other``). A kernel record carries
what ``kernelcache build --from-misses`` needs to compile it again: the kernel, its key, the JIT
function's module and qualname, and Triton's own ``specialization_data`` JSON. The manager only
sees keys, so the specialization comes from Triton's compile listener, which ``sitecustomize``
attaches as Triton is imported (``on_compile``). Records are single ``write`` calls on an
``O_APPEND`` descriptor, so many processes can share one log.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import sys
import threading
import time
import uuid

from triton import knobs
from triton.runtime.cache import CacheManager, FileCacheManager

try:
    from . import kernelcache_records  # imported as kernelcache.hooks.kernelcache_overlay
except ImportError:
    import kernelcache_records  # imported from the served site dir (TRITON_CACHE_MANAGER)

BASE_ENV = "KERNELCACHE_BASE_DIR"
LOG_ENV = "KERNELCACHE_MISS_LOG"
_lock = threading.Lock()
_pending: dict[str, dict] = {}  # kernel key -> miss record waiting for its specialization


class OverlayCacheManager(CacheManager):
    def __init__(self, key, override=False, dump=False):
        self.key = key
        self.plain = FileCacheManager(key, override=override, dump=dump) if (override or dump) else None
        base = os.environ.get(BASE_ENV)
        self.base = os.path.join(base, key) if base else None
        if not knobs.cache.dir:
            raise RuntimeError("kernelcache overlay: TRITON_CACHE_DIR (the writable overlay) is not set")
        self.overlay = os.path.join(knobs.cache.dir, key)

    def get_file(self, filename):
        if self.plain is not None:
            return self.plain.get_file(filename)
        for root in (self.overlay, self.base):
            if root and os.path.isfile(os.path.join(root, filename)):
                return os.path.join(root, filename)
        return None

    def get_group(self, filename):
        if self.plain is not None:
            return self.plain.get_group(filename)
        return (_group(self.base, filename) if self.base else None) or _group(self.overlay, filename)

    def put(self, data, filename, binary=True):
        if self.plain is not None:
            return self.plain.put(data, filename, binary)
        path = _write(self.overlay, filename, data)
        if filename.endswith(".so") or filename.endswith(".autotune.json"):
            log({"kind": "module" if filename.endswith(".so") else "other", "file": filename, "key": self.key})
        return path

    def put_group(self, filename, group):
        if self.plain is not None:
            return self.plain.put_group(filename, group)
        path = self.put(json.dumps({"child_paths": group}), f"__grp__{filename}", binary=False)
        record = {"kind": "kernel", "kernel": filename.removesuffix(".json"), "key": self.key}
        if _listener_attached():
            with _lock:
                _pending[self.key] = record
        else:
            log(record)
        return path


def _group(entry: str, filename: str) -> dict | None:
    """A complete group in ``entry``: every child found by basename, or None (a miss)."""
    try:
        with open(os.path.join(entry, f"__grp__{filename}"), encoding="utf-8") as handle:
            children = json.load(handle).get("child_paths")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(children, dict):
        return None
    found = {}
    for name, path in children.items():
        base = os.path.basename(str(path))
        if base in ("", ".", "..") or not os.path.isfile(os.path.join(entry, base)):
            return None
        found[name] = os.path.join(entry, base)
    return found


def _write(entry: str, filename: str, data) -> str:
    """Triton's discipline: write into a private temp dir, ``os.replace`` into place."""
    temp = os.path.join(entry, f"tmp.pid_{os.getpid()}_{uuid.uuid4()}")
    os.makedirs(temp, exist_ok=True)
    binary = isinstance(data, bytes)
    with open(os.path.join(temp, filename), "wb" if binary else "w") as handle:
        handle.write(data if binary else str(data))
    target = os.path.join(entry, filename)
    os.replace(os.path.join(temp, filename), target)
    os.removedirs(temp)
    return target


# -- the miss log ---------------------------------------------------------------------------------


def log(record: dict) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    record = {"event": "miss", **record, "time": time.time(), "pid": os.getpid(),
              "base": os.environ.get(BASE_ENV), "overlay": knobs.cache.dir}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    kernelcache_records.append_line(path, record)


def on_compile(*, src, metadata, metadata_group, times, cache_hit) -> None:
    """Triton's compile listener: complete the pending record of a kernel this process compiled."""
    if cache_hit:
        return
    key = base64.b32encode(bytes.fromhex(metadata["hash"])).decode().rstrip("=")
    with _lock:
        record = _pending.pop(key, None)
    if record is not None:
        record.update(specialization(src, metadata))
        log(record)


def specialization(src, metadata: dict) -> dict:
    """What replaying this compile needs: the function, the target, and Triton's specialization JSON."""
    fn = getattr(src, "fn", None)
    raw = getattr(fn, "fn", None)
    if raw is None:
        return {"specialization_data": None, "why": "not compiled from a @triton.jit function"}
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import get_full_name, serialize_specialization_data

    target = metadata["target"]
    backend = make_backend(target)
    fields = type(backend.parse_options({})).__dataclass_fields__
    options = backend.parse_options({k: v for k, v in metadata.items() if k in fields})
    names = list(src.signature)
    return {
        "fn_module": raw.__module__,
        "fn_qualname": raw.__qualname__,
        "target": {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size},
        "num_warps": metadata.get("num_warps"),
        "num_stages": metadata.get("num_stages"),
        "signature": dict(src.signature),
        "constexprs": {_param(names, k): _plain(v) for k, v in src.constants.items()},
        "attrs": {_param(names, k): v for k, v in src.attrs.items() if v},
        "specialization_data": serialize_specialization_data(get_full_name(raw), src.signature, src.constants,
                                                             src.attrs, options, None),
    }


def _param(names: list, index) -> str:
    if isinstance(index, tuple) and len(index) == 1 and isinstance(index[0], int) and index[0] < len(names):
        return names[index[0]]
    return str(index)


def _plain(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    return str(value)


def _listener_attached() -> bool:
    return getattr(sys.modules.get("sitecustomize"), "KERNELCACHE_OVERLAY_LISTENER", False) or _fallback_attached


def _flush_pending() -> None:
    """At exit: misses whose compile listener never ran (the listener was replaced) still get logged."""
    with _lock:
        left = list(_pending.values())
        _pending.clear()
    for record in left:
        log({**record, "specialization_data": None, "why": "the compile listener did not see this compile"})


def _attach_fallback() -> bool:
    """Without sitecustomize (PYTHONPATH reset, python -S): attach now; only the first compile is missed."""
    if getattr(sys.modules.get("sitecustomize"), "KERNELCACHE_OVERLAY_LISTENER", False):
        return False
    previous = knobs.compilation.listener

    def listener(**kwargs):
        on_compile(**kwargs)
        if previous is not None:
            previous(**kwargs)

    knobs.compilation.listener = listener
    return True


_fallback_attached = _attach_fallback()
atexit.register(_flush_pending)
