"""Which kernel choices the GPU's device name decided, recorded while vLLM's own code makes them.

A Triton key depends on the GPU through the arch, the SM count (vLLM's split top-p kernels) and, for some
families, the device name: vLLM reads tuned-config tables whose file name holds
``current_platform.get_device_name()`` (spaces as ``_``), and their tile sizes and warp counts become
constexprs. vLLM 0.33 has two such tables on the paths kernelcache builds:

* ``fused_moe.get_moe_configs(E, N, dtype, block_n, block_k)``: the fused-MoE tile configs,
  ``configs/E=..,N=..,device_name=...json`` (``get_config_file_name`` maps the H200 family to ``NVIDIA_H200``);
* ``mamba_ssm.get_ssm_configs(headdim, dstate, cache_dtype)``: ``selective_state_update``'s block size and
  warps, ``configs/selective_state_update/headdim=..,dstate=..,device_name=...,cache_dtype=...json``.

Both look in ``VLLM_TUNED_CONFIG_FOLDER`` first, then in vLLM's package; no file means vLLM's default
config. ``track(module, name)`` wraps such a loader (a family's exercise calls it before it runs vLLM):
each distinct call is logged once, as an event in the compile log, with the file vLLM read (name, sha256)
and the GPU profiles of the same arch and SM count whose device name gets the same configs from vLLM's
own loader (``serves``). A lookup of a ``device_name=`` file outside a tracked loader is logged too (by
``watch``), with ``serves`` holding the build's own profiles only: a table kernelcache does not know is one
it cannot vouch for on another product.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..plan.gpus import PROFILES

EVENT = "device_table"
MARK = "device_name="
PROFILES_ENV = "KERNELCACHE_DEVICE_PROFILES"  # JSON {profile name: device name}: the products a bundle may serve
_state = threading.local()
_seen: set[tuple] = set()
_log_path: list[str] = []


def start(log_path: str) -> None:
    """Log to ``log_path`` (the process's compile log) and watch for unknown device-keyed lookups."""
    _log_path[:] = [log_path]
    watch()


def track(module: Any, name: str) -> None:
    """Wrap ``module.name``, a loader of a device-keyed table, so each distinct call is logged once."""
    original = getattr(module, name)
    if getattr(original, "_kernelcache_tracked", False):
        return
    loader = f"{module.__name__}.{name}"

    @functools.wraps(original)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        if getattr(_state, "inside", False):
            return original(*args, **kwargs)
        with _inside():
            result = original(*args, **kwargs)
            _record(loader, getattr(original, "__wrapped__", original), args, kwargs)
        return result

    tracked._kernelcache_tracked = True  # type: ignore[attr-defined]
    setattr(module, name, tracked)


def watch() -> None:
    """Log any ``device_name=`` file looked up outside a tracked loader (``os.path.exists``, as vLLM's
    loaders look), so a device-keyed table kernelcache does not know still marks the bundle."""
    original = os.path.exists
    if getattr(original, "_kernelcache_watched", False):
        return

    def exists(path: Any) -> bool:
        found = original(path)
        name = os.path.basename(path) if isinstance(path, str) else ""
        if MARK in name and not getattr(_state, "inside", False) and getattr(_state, "probing", None) is None:
            own = _device_name()
            _log({"loader": None, "looked_for": name, "file": name if found else None,
                  "sha256": _sha256(path) if found else None, "configs_sha256": None,
                  "serves": {profile: device for profile, device in _candidates().items() if device == own}})
        return found

    exists._kernelcache_watched = True  # type: ignore[attr-defined]
    os.path.exists = exists


def _record(loader: str, raw: Callable, args: tuple, kwargs: dict) -> None:
    key = (loader, repr(args), repr(sorted(kwargs.items())))
    if key in _seen:
        return
    _seen.add(key)
    own = _device_name()
    looked, configs = _probe(raw, args, kwargs, own)  # the body again: a cached first answer looked up nothing
    found = next((path for path, there in looked if there), None)
    serves = {profile: device for profile, device in _candidates().items()
              if _probe(raw, args, kwargs, device)[1] == configs}
    _log({"loader": loader, "looked_for": os.path.basename(looked[-1][0]) if looked else None,
          "file": os.path.basename(found) if found else None, "sha256": _sha256(found) if found else None,
          "configs_sha256": hashlib.sha256(configs.encode()).hexdigest(), "serves": serves})


def _probe(raw: Callable, args: tuple, kwargs: dict, device: str) -> tuple[list[tuple[str, bool]], str]:
    """Call the loader's uncached body as if the GPU were ``device``: the files it looked for (in order, and
    whether each was there) and its answer in canonical JSON."""
    looked: list[tuple[str, bool]] = []
    with _device(device), _looking(looked):
        result = raw(*args, **kwargs)
    return looked, json.dumps(result, sort_keys=True, default=str)


@contextlib.contextmanager
def _device(name: str) -> Iterator[None]:
    """``current_platform.get_device_name()`` answers ``name`` (and vLLM's cached file-name form follows)."""
    from vllm.platforms import current_platform
    from vllm.utils import platform_utils

    before = current_platform.__dict__.get("get_device_name")
    current_platform.get_device_name = lambda device_id=0: name
    platform_utils.get_device_name_as_file_name.cache_clear()
    try:
        yield
    finally:
        if before is None:
            del current_platform.get_device_name
        else:
            current_platform.get_device_name = before
        platform_utils.get_device_name_as_file_name.cache_clear()


@contextlib.contextmanager
def _looking(looked: list[tuple[str, bool]]) -> Iterator[None]:
    previous = getattr(_state, "probing", None)
    original = os.path.exists

    def exists(path: Any) -> bool:
        found = original(path)
        if isinstance(path, str) and MARK in os.path.basename(path):
            looked.append((os.fspath(path), found))
        return found

    _state.probing = looked
    os.path.exists = exists
    try:
        yield
    finally:
        os.path.exists = original
        _state.probing = previous


@contextlib.contextmanager
def _inside() -> Iterator[None]:
    _state.inside = True
    try:
        yield
    finally:
        _state.inside = False


def _device_name() -> str:
    from vllm.platforms import current_platform

    return current_platform.get_device_name()


def _candidates() -> dict[str, str]:
    """Profile name -> device name, for the profiles of the build's arch and SM count (``PROFILES_ENV``)."""
    return json.loads(os.environ.get(PROFILES_ENV) or "{}")


def _sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _log(record: dict) -> None:
    from ..format.compilelog import append

    if _log_path:
        append(_log_path[0], {"event": EVENT, "task": os.environ.get("KERNELCACHE_TASK"), "device": _device_name(),
                              **record})


def candidates_env(arch_capability: int, sm_count: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """``PROFILES_ENV`` for an exercise process: the built-in profiles of that arch and SM count plus ``extra``."""
    found = {p.name: p.product for p in PROFILES.values() if p.capability == arch_capability and p.sm_count == sm_count}
    return {PROFILES_ENV: json.dumps({**found, **(extra or {})}, sort_keys=True)}
