"""FlashInfer's ``sampling`` module in the build cache: nvcc builds it once per FlashInfer release, toolchain and arch.

A cross build makes the module with FlashInfer's own JIT spec in a child that gets only kernelcache's build
variables (exercise/flashinfer_sampling.py), so what decides it is what FlashInfer's own JIT cache trusts (its release:
``<version>/<archs>/cached_ops``), the CUDA toolchain, the host C/C++ compilers, the arch and the platform; the
key is the digest of those (``module_key``), in the form of a Triton key so the stores keep it beside the
kernels. The entry holds the module (``sampling.so``) and its record (``module.json``: what the bundle's manifest
says of it). nvcc names its temporary files by process id and the module keeps those names, so no two builds of
it are the same bytes: a reused module is one of them, the one every later build then bundles.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable

from ..exercise.flashinfer_sampling import member_path
from ..format.fingerprint import package_version, platform_tag
from ..format.manifest import FlashInferModule, Member
from . import BuildCacheSpec, open_store
from .blob import CorruptEntry, pack, unpack

RECORD = "module.json"


def module_key(arch_list: str, cuda: str) -> str:
    """The key of FlashInfer's ``sampling`` module for ``arch_list`` (``9.0``) built with CUDA ``cuda``."""
    inputs = {"module": "sampling", "flashinfer": package_version("flashinfer-python"),
              "tvm_ffi": package_version("apache-tvm-ffi"), "cuda": cuda, "arch": arch_list,
              "platform": platform_tag(), "compilers": [_version_line(c) for c in ("gcc", "c++")]}
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).digest()
    return base64.b32encode(digest).decode().rstrip("=")


def take_or_build(spec: BuildCacheSpec | None, key: str,
                  build: Callable[[], tuple[FlashInferModule, list[Member]]]) -> tuple[tuple, str | None]:
    """((module, members), what the build cache did: "reused", "published", "corrupt", "error: …" or None)."""
    if spec is None:
        return build(), None
    store, problem = open_store(spec), None
    try:
        for blob in store.get(key):
            found = _module(blob, key)
            if found is not None:
                return found, "reused"
            problem = "corrupt"
    except CorruptEntry:
        problem = "corrupt"
    except Exception as exc:  # noqa: BLE001 -- the store failed: build instead, and say so
        problem = f"error: reading: {type(exc).__name__}: {exc}"
    module, members = build()
    try:
        record = {"name": module.name, "version": module.version, "cuda": module.cuda, "archs": list(module.archs),
                  "tvm_ffi": module.tvm_ffi}
        entry, blob = pack(key, "flashinfer", None, {RECORD: json.dumps(record, sort_keys=True).encode(),
                                                     "sampling.so": members[0].data})
        store.put(key, entry.variant, blob)
    except Exception as exc:  # noqa: BLE001 -- the module is built; only the cache missed out
        return (module, members), problem or f"error: writing: {type(exc).__name__}: {exc}"
    return (module, members), problem or "published"


def _module(blob: bytes, key: str) -> tuple[FlashInferModule, list[Member]] | None:
    """The module a blob holds (None when it is not a complete ``flashinfer`` entry for ``key``)."""
    try:
        entry, files = unpack(blob, key)
        record = json.loads(files[RECORD])
        data = files["sampling.so"]
        module = FlashInferModule(name=record["name"], version=record["version"], cuda=record["cuda"],
                                  archs=tuple(record["archs"]), tvm_ffi=record["tvm_ffi"], files=())
    except (CorruptEntry, KeyError, TypeError, ValueError):
        return None
    if entry.kind != "flashinfer":
        return None
    return module, [Member(member_path(module, data), data=data)]


def _version_line(command: str) -> str | None:
    """The first line of ``command --version`` (None when it is not on PATH)."""
    path = shutil.which(command)
    if path is None:
        return None
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.splitlines() or [""])[0]
