"""Read a Triton cache directory into bundle entries, skipping anything incomplete.

A Triton cache holds one directory per key. A kernel directory is complete once its
``__grp__<name>.json`` exists: Triton writes that group file last (``FileCacheManager.put_group`` in
triton/runtime/cache.py). Its
``child_paths`` are absolute, so the bundle stores a relocatable group that names children by
basename; ``install`` writes the absolute form for wherever the cache lands. Directories that hold
only gcc-built extension modules (``__triton_launcher*.so``, ``cuda_utils*.so``) have no group file
and are kept as modules. ``tmp.*`` directories and groups with missing children are skipped, and
each skip is reported with its reason.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .format.cachekey import KEY_PATTERN
from .format.compilelog import CompileRecord
from .format.manifest import Kernel, Member, Module
from .hooks.kernelcache_prebuilt import SOURCE_SUFFIX

BINARY_SUFFIXES = (".cubin", ".hsaco")
_ARG = re.compile(r"%([A-Za-z_][\w]*): (!tt\.ptr<([\w]+)>|[a-z]+\d*)")
_TYPES = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp64", "i1": "i1"}


@dataclass(frozen=True)
class Entry:
    """A kernel or module, before hashing: its manifest fields minus ``files``, plus members."""

    kind: str  # "kernel" | "module"
    key: str
    members: tuple[Member, ...]
    info: dict


@dataclass
class Harvest:
    entries: list[Entry] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)

    def skip(self, path: str, reason: str) -> None:
        self.skipped.append({"path": path, "reason": reason})

    @property
    def kernels(self) -> list[Entry]:
        return [e for e in self.entries if e.kind == "kernel"]


def harvest(cache_dir: str | os.PathLike, compiles: Iterable[CompileRecord] = (), keep_ir: bool = False) -> Harvest:
    """Every complete entry of ``cache_dir``; ``compiles`` (the listener's records) give each kernel's
    signature and constexprs, which Triton's own files lack."""
    root = Path(cache_dir)
    records = {r.key: r for r in compiles}
    result = Harvest()
    for name in sorted(os.listdir(root)):
        path = root / name
        if name.startswith("."):
            continue
        if not path.is_dir() or path.is_symlink():
            result.skip(name, "not a cache entry directory")
        elif name.startswith("tmp."):
            result.skip(name, "temporary directory of an interrupted write")
        elif not KEY_PATTERN.fullmatch(name):
            result.skip(name, "not a Triton cache key")
        else:
            _harvest_dir(path, records.get(name), keep_ir, result)
    return result


def _harvest_dir(path: Path, record: CompileRecord | None, keep_ir: bool, result: Harvest) -> None:
    files = sorted(p.name for p in path.iterdir() if p.is_file() and not p.is_symlink())
    for sub in sorted(p.name for p in path.iterdir() if p.is_dir()):
        result.skip(f"{path.name}/{sub}", "temporary directory of an interrupted write")
    groups = [f for f in files if f.startswith("__grp__") and f.endswith(".json")]
    if groups:
        for group in groups:
            _harvest_kernel(path, group, files, record, keep_ir, result)
    elif files and all(f.endswith((".so", SOURCE_SUFFIX)) for f in files):
        members = tuple(Member(f"{path.name}/{f}", source=path / f) for f in files)
        built = [f for f in files if f.endswith(".so")]
        members += _source_record(path.name, built)
        result.entries.append(Entry("module", path.name, members, {"kind": _module_kind(built)}))
    else:
        result.skip(path.name, "no group file: an incomplete write or not a kernel")


def _harvest_kernel(path: Path, group: str, files: list[str], record: CompileRecord | None, keep_ir: bool,
                    result: Harvest) -> None:
    name = group[len("__grp__"):-len(".json")]
    where = f"{path.name}/{group}"
    try:
        children = json.loads((path / group).read_text())["child_paths"]
        listed = sorted(os.path.basename(p) for p in children.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        result.skip(where, "unreadable group file")
        return
    binaries = [f for f in listed if f.endswith(BINARY_SUFFIXES)]
    needed = [f"{name}.json", *binaries]
    missing = [f for f in needed if f not in files]
    if not binaries or missing:
        result.skip(where, f"incomplete entry: missing {', '.join(missing) or 'binary'}")
        return
    try:
        metadata = json.loads((path / f"{name}.json").read_text())
    except (OSError, ValueError):
        result.skip(where, "unreadable metadata json")
        return
    keep = [f for f in listed if f in files] if keep_ir else needed
    relocatable = json.dumps({"child_paths": {f: f for f in sorted(keep)}}, sort_keys=True).encode()
    members = [Member(f"{path.name}/{f}", source=path / f) for f in sorted(keep)]
    members.append(Member(f"{path.name}/{group}", data=relocatable))
    info = {
        "name": name,
        "num_warps": metadata.get("num_warps"),
        "num_stages": metadata.get("num_stages"),
        **_specialization(path, name, record),
    }
    result.entries.append(Entry("kernel", path.name, tuple(sorted(members, key=lambda m: m.path)), info))


def _specialization(path: Path, name: str, record: CompileRecord | None) -> dict:
    """Signature, constexprs and attrs: from the compile log, else the argument list of the IR."""
    if record is not None:
        return {"signature": record.signature, "constexprs": record.constexprs, "attrs": record.attrs}
    for suffix in (".source", ".ttir"):
        ir = path / f"{name}{suffix}"
        if ir.is_file():
            return {"signature": _ir_signature(ir.read_text(errors="replace"), name), "constexprs": None,
                    "attrs": None}
    return {"signature": None, "constexprs": None, "attrs": None}


def _ir_signature(text: str, name: str) -> dict[str, str] | None:
    start = text.find(f"tt.func public @{name}(")
    if start < 0:
        return None
    header = text[start: text.find(") attributes", start)]
    sig = {}
    for arg, full, pointee in _ARG.findall(header):
        ty = _TYPES.get(pointee, pointee) if pointee else _TYPES.get(full, full)
        sig[arg] = f"*{ty}" if pointee else ty
    return sig or None


def _source_record(key: str, files: list[str]) -> tuple[Member, ...]:
    """``<key>/cuda_utils.source-sha256``: the sha256 of the ``driver.c`` this Triton builds ``cuda_utils`` from, for
    a served process to take the module for its own when its key (from Triton 3.7: the install paths) differs
    (hooks/kernelcache_prebuilt.py). Nothing when the dir has one already or holds no ``cuda_utils``."""
    if [f.split(".")[0] for f in files] != ["cuda_utils"] or any(f.endswith(SOURCE_SUFFIX) for f in files):
        return ()
    source = _driver_source()
    if source is None:
        return ()
    return (Member(f"{key}/cuda_utils{SOURCE_SUFFIX}", data=hashlib.sha256(source).hexdigest().encode()),)


def _driver_source() -> bytes | None:
    """The bytes of ``triton/backends/nvidia/driver.c`` of the Triton this process would import, if any."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "backends" / "nvidia" / "driver.c"
    try:
        return path.read_bytes()
    except OSError:
        return None


def _module_kind(files: list[str]) -> str:
    if all(f.startswith("__triton_launcher") for f in files):
        return "launcher"
    if all(f.startswith("cuda_utils") for f in files):
        return "cuda_utils"
    return "other"


def to_manifest_entries(entries: list[Entry], records: dict[str, list]) -> tuple[list[Kernel], list[Module]]:
    """Manifest objects for harvested entries, given each entry's hashed ``FileRecord`` list."""
    kernels, modules = [], []
    for entry in entries:
        files = tuple(records[entry.key])
        if entry.kind == "kernel":
            kernels.append(Kernel(key=entry.key, files=files, **entry.info))
        else:
            modules.append(Module(key=entry.key, files=files, **entry.info))
    kernels.sort(key=lambda k: (k.name, k.key))
    modules.sort(key=lambda m: (m.kind, m.key))
    return kernels, modules
