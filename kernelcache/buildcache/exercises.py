"""Exercise records: what one exercise process of a cross build produced, kept in the build cache under a key of
everything it read, so a later build with the same inputs runs no exercise process for that unit.

The kernels of a build already come from the build cache by Triton's key (buildcache/manager.py); what is left
of a warm build is the exercise itself: a process per unit of the plan (plan/tasks.py ``plan_units``) that
imports torch and vLLM and runs vLLM's code under the fake target. A record holds that process's outputs as the
build reads them: its compile log, its result file, and the cache keys it used (every kernel ``compile()``
gave it, every helper module Triton looked up, built or took). A build that finds a record for a unit writes the
log and result into the unit's job dir and the keys' entries into the target's ``TRITON_CACHE_DIR``; the harvest
then reads the same files a fresh process would have left, and the bundle is the same bytes.

The key (``unit_key``) is the digest of what decides those outputs:

* the unit as the exercise process gets it: its tasks and their arguments, the target's capability, SM count and
  mode, the setup task, the exercise variables (paths of the build's scratch dir left out; the C compiler by its
  path and ``--version``), each task module by its file and sha256;
* the GPU product only for a unit with a path vLLM configures by device name (``Family.keys_follow_device``): a unit
  without one is shared by every product of the arch and SM count. A build whose other unit reads a device
  table fails (build.py ``device_keys_of``), and a record whose log holds a device-table lookup is never kept;
* the stack (``stack_inputs``): the digests of the Python sources of kernelcache, vLLM, torch, Triton and
  FlashInfer, Triton's own ``triton_key()``, every installed distribution's name and version, the Python
  version and platform, where those packages are installed (a kernel's line info names its source file), and
  the ``VLLM_*``, ``TRITON_*``, ``TORCH*``, ``CUDA*``, ``FLASHINFER_*`` and ``KERNELCACHE_*`` variables.

Within one build, a unit whose key several targets share (the products of one SM count) runs once and the
others copy what it left (``UnitRecords.reuse``), with or without a build cache. Only cross builds keep and take
records: a native exercise runs on the GPU that is there, which no key could name. A record is kept only when
the target's units account for every directory of its ``TRITON_CACHE_DIR``; restoring one checks each entry as
the exercise process would (sha256, this install's paths) and falls back to running the unit when any is missing
or bad.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from ..errors import BuildFailed
from ..exercise.device_tables import PROFILES_ENV
from ..exercise.worker import Job
from ..format.cachekey import KEY_PATTERN
from ..format.compilelog import read as read_log
from ..plan import families
from ..plan.tasks import device_name_modules
from . import RecordCounts
from .blob import CorruptEntry, pack, unpack

FORMAT = 1
KIND = "exercise"
SOURCES = ("kernelcache", "vllm", "torch", "triton", "flashinfer")
VARIABLE_PREFIXES = ("VLLM_", "TRITON_", "TORCH", "CUDA", "FLASHINFER_", "KERNELCACHE_", "PYTORCH_")
# Variables that name where this build writes or which store it uses, or how many threads vLLM's JIT warmup
# compiles with (the number of units a build runs at once decides it), not what the exercise computes.
SCRATCH_VARIABLES = ("CC", "KERNELCACHE_REAL_CC", "KERNELCACHE_BUILD_CACHE", "KERNELCACHE_COMPILE_LOG",
                     "TRITON_CACHE_DIR", "TRITON_CACHE_MANAGER", "VLLM_TRITON_JIT_WARMUP_NUM_THREADS")
LOG, RESULT, KEYS = "compiles.jsonl", "result.json", "keys.json"
MODULE_OUTCOMES = ("hit", "published", "present")


@dataclass(frozen=True)
class UnitUse:
    """The cache keys one exercise process used: kernels (``compile()`` records) and gcc-built helper modules."""

    kernels: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()

    @property
    def keys(self) -> set[str]:
        return set(self.kernels) | set(self.modules)

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, "kernels": list(self.kernels), "modules": list(self.modules)},
                          sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> UnitUse:
        data = json.loads(raw)
        if data.get("format") != FORMAT:
            raise CorruptEntry(f"exercise record format {data.get('format')!r}, not {FORMAT}")
        return cls(tuple(map(str, data["kernels"])), tuple(map(str, data["modules"])))

    @classmethod
    def of_log(cls, records: list[dict]) -> UnitUse:
        kernels = {r["key"] for r in records if r.get("event", "compile") == "compile" and "key" in r}
        modules = {r["key"] for r in records if r.get("event") == "build_cache" and r.get("kind") == "module"
                   and r.get("outcome") in MODULE_OUTCOMES}
        return cls(tuple(sorted(kernels)), tuple(sorted(modules)))


def product_bound(job: Job) -> bool:
    """Whether a unit runs a path vLLM configures by device name (its outputs then depend on the product)."""
    return any(task.call.split(":")[0] in device_name_modules().values() for task in job.tasks)


def outside_cache(job: Job) -> bool:
    """Whether the unit leaves outputs outside its Triton cache dir: a task of a family whose tasks build FlashInfer
    modules (flashinfer_attention's) leaves them in FlashInfer's workspace, which no record holds, so such a unit
    always runs (and is never recorded)."""
    calls = {families.get(path).exercise for path in families.flashinfer("tasks")}
    return any(t.call in calls for t in job.tasks)


def unit_key(job: Job, stack: dict) -> str:
    """The record key of ``job``: a Triton-shaped key (base32 of a sha256) of the unit and the stack."""
    inputs = {"format": FORMAT, "unit": unit_inputs(job), "stack": stack}
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).digest()
    return base64.b32encode(digest).decode().rstrip("=")


def unit_inputs(job: Job) -> dict:
    """``job`` without what names this build's scratch dir, and without the product where it cannot matter."""
    bound = product_bound(job)
    env = {k: v for k, v in job.env.items() if k not in SCRATCH_VARIABLES}
    if not bound:
        env.pop(PROFILES_ENV, None)  # the profiles' products: read by device-table lookups only
    setup = [_task(t, drop=() if bound else ("product",)) for t in job.setup]
    return {"capability": job.capability, "sm_count": job.sm_count, "mode": job.mode, "prebuild": job.prebuild,
            "served": job.served, "tune": job.tune, "tasks": [_task(t) for t in job.tasks], "setup": setup,
            "env": env, "cc": compiler(job.env.get("KERNELCACHE_REAL_CC")), "modules": task_modules(job)}


def task_modules(job: Job) -> dict[str, list[str] | None]:
    """Each task module by its file and that file's sha256 (None: not found): a task module outside the packages
    of ``SOURCES`` (an extra task of the user's) counts by its own file."""
    found = {}
    for task in (*job.setup, *job.tasks):
        name = task.call.split(":")[0]
        if name not in found:
            origin = _origin(name)
            found[name] = [origin, _file_digest(origin)] if origin else None
    return found


def _origin(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return os.path.realpath(spec.origin) if spec and spec.origin and os.path.isfile(spec.origin) else None


def _file_digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _task(task, drop: tuple[str, ...] = ()) -> dict:
    return {"call": task.call, "label": task.label, "kwargs": {k: v for k, v in task.kwargs.items() if k not in drop}}


@lru_cache(maxsize=8)
def compiler(path: str | None) -> list[str] | None:
    """A C compiler by its path and the first line of its ``--version``."""
    if not path:
        return None
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return [path, "?"]
    return [path, (done.stdout.splitlines() or ["?"])[0]]


def stack_inputs() -> dict:
    """What the exercise processes run on, beyond the unit: sources, versions, install places, variables."""
    return {"python": sys.version, "platform": platform.platform(), "sources": source_digests(),
            "triton_key": _triton_key(), "distributions": _distributions(), "roots": install_roots(),
            "variables": {k: v for k, v in sorted(os.environ.items())
                          if k.startswith(VARIABLE_PREFIXES) and k not in SCRATCH_VARIABLES}}


def source_digests() -> dict[str, str | None]:
    """Per package of ``SOURCES``: the sha256 over its ``.py`` files (relative path and content), None if absent."""
    return {name: _tree_digest(root) if (root := package_root(name)) else None for name in SOURCES}


def package_root(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or ()) if spec else []
    return os.path.realpath(folders[0]) if folders else None


def install_roots() -> list[str]:
    """Where the exercise's code comes from (the kernels' line info names files there)."""
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    roots.update(r for name in SOURCES if (r := package_root(name)))
    return sorted(roots)


def _tree_digest(root: str) -> str:
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as handle:
                    digest.update(os.path.relpath(path, root).encode() + b"\0"
                                  + hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()


def _triton_key() -> str | None:
    """Triton's ``triton_key()`` (its version and the digest of its own files and libraries), or None."""
    try:
        from triton.compiler.compiler import triton_key
    except ImportError:
        return None
    return triton_key()


def _distributions() -> list[str]:
    return sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                   if d.metadata["Name"]})


# -- keep and take ----------------------------------------------------------------------------------------------


def keep(store, key: str, job_dir: Path, use: UnitUse) -> None:
    """Write the record of the unit that ran in ``job_dir`` (its log, its result, the keys it used) to ``store``."""
    files = {LOG: (job_dir / "compiles.jsonl").read_bytes(), RESULT: (job_dir / "job.json.result").read_bytes(),
             KEYS: use.to_json()}
    entry, blob = pack(key, KIND, None, files)
    store.put(key, entry.variant, blob)


def take(store, key: str) -> dict[str, bytes] | None:
    """The files of ``key``'s record, or None (no record, or none that is complete and consistent)."""
    for blob in store.get(key):
        try:
            entry, files = unpack(blob, key)
        except CorruptEntry:
            continue
        if entry.kind == KIND and set(files) == {LOG, RESULT, KEYS}:
            return files
    return None


def restore(store, files: dict[str, bytes], job_dir: Path, cache_dir: Path, roots: list[str]) -> UnitUse | None:
    """Write a record's log and result into ``job_dir`` and its keys' entries into ``cache_dir``, and say which
    entries were written; None (nothing written) when an entry is missing, corrupt, or embeds a path outside
    ``roots`` (another install's)."""
    try:
        use = UnitUse.from_json(files[KEYS])
    except (CorruptEntry, ValueError, KeyError, TypeError):
        return None
    entries = {}
    for kind, keys in (("kernel", use.kernels), ("module", use.modules)):
        for key in keys:
            if not KEY_PATTERN.fullmatch(key):
                return None
            if not (cache_dir / key).is_dir():
                found = _entry(store, key, kind, roots)
                if found is None:
                    return None
                entries[key] = found
    for key, (entry, blobs) in entries.items():
        _write_entry(cache_dir / key, entry, blobs)
    job_dir.mkdir(parents=True, exist_ok=True)
    _write(job_dir / "compiles.jsonl", files[LOG])
    _write(job_dir / "job.json.result", files[RESULT])
    return UnitUse(tuple(k for k in use.kernels if k in entries), tuple(k for k in use.modules if k in entries))


def _entry(store, key: str, kind: str, roots: list[str]):
    for blob in store.get(key):
        try:
            entry, files = unpack(blob, key)
        except CorruptEntry:
            continue
        if entry.kind == kind and all(_under(p, roots) for p in entry.paths):
            return entry, files
    return None


def _under(path: str, roots: list[str]) -> bool:
    path = os.path.normpath(path)
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _write_entry(folder: Path, entry, files: dict[str, bytes]) -> None:
    """An entry as Triton's ``FileCacheManager`` writes it: the files, then (a kernel) the group file last."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, data in sorted(files.items()):
        _write(folder / name, data)
        written[name] = str(folder / name)
    if entry.kind == "kernel":
        _write(folder / f"__grp__{entry.group}", json.dumps({"child_paths": written}).encode())


def _write(path: Path, data: bytes) -> None:
    """Write through a temporary name of this thread's own: a build restores its units from several threads into one
    cache dir, and units share entries, so two threads may write one file at once (the last rename wins, whole)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def unaccounted(cache_dir: Path, uses: list[UnitUse]) -> list[str]:
    """Directories of ``cache_dir`` that no unit's record names (records would then not rebuild the dir)."""
    named = set().union(*(u.keys for u in uses)) if uses else set()
    return sorted(p.name for p in cache_dir.iterdir() if p.is_dir() and p.name not in named)


def log_records(job_dir: Path) -> list[dict]:
    return read_log(str(job_dir / "compiles.jsonl"))


def device_bound_log(records: list[dict]) -> bool:
    """Whether a unit's log holds a lookup of a device-keyed table (its outputs depend on the product)."""
    return any(r.get("event") == "device_table" for r in records)



@dataclass
class _Owner:
    """The first unit of a key in this build: the others of the key wait for it and copy what it left."""

    job_dir: Path
    cache_dir: Path
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


class UnitRecords:
    """Exercise records for the cross targets of one build. Before a unit runs (``reuse``): a unit of the same key
    that another target of this build ran is copied from there (the unit runs once per build, whichever products
    need it), else a record from the build cache (``store``; None: none) is restored. Once a target's units are
    done, ``keep`` records the ones that ran."""

    def __init__(self, store=None, stack: dict | None = None):
        self.store = store
        self.stack = stack if stack is not None else stack_inputs()
        self._lock = threading.Lock()
        self._owners: dict[str, _Owner] = {}
        self._written: dict[Path, UnitUse] = {}  # job dir of a unit not run here -> the entries it brought
        self._keys: dict[Path, str] = {}  # job dir -> its unit's key (hashing the task modules once per unit)
        self._records: dict[str, dict[str, bytes] | None] = {}  # key -> the record's files as ``take`` read them
        self._roots: list[str] | None = None
        self._errors: list[str] = []
        self._stopped = False

    def reuse(self, job_dir: Path, job: Job) -> bool:
        """Write the unit's outputs from another target of this build or from a record (True: it need not run)."""
        key = self._key(job_dir, job)
        with self._lock:
            owner = self._owners.get(key)
            if owner is None:
                self._owners[key] = _Owner(job_dir, Path(job.cache_dir))
        if owner is not None:
            owner.done.wait()
            if self._stopped:
                raise BuildFailed("another target of this build failed")
            return owner.ok and self._done(job_dir, copy_unit(owner.job_dir, owner.cache_dir, job_dir,
                                                              Path(job.cache_dir)))
        if self.store is None or outside_cache(job):
            return False
        try:
            files = self._record(key)
            roots = self._install_roots() + [os.path.dirname(m[0]) for m in task_modules(job).values() if m]
            written = restore(self.store, files, job_dir, Path(job.cache_dir), roots) if files is not None else None
        except Exception as exc:  # noqa: BLE001 -- the store failed: run the unit instead, and say so
            self._errors.append(f"reading: {type(exc).__name__}: {exc}")
            written = None
        if written is not None:
            self.ran(job_dir, job, True)
        return self._done(job_dir, written)

    def expects_to_run(self, job_dir: Path, job: Job) -> bool:
        """Whether no record of the unit is kept (``reuse`` then runs it, unless another target of this build does):
        the build gives the cores to the units that run (exercise/jobs.py ``_share_cores``)."""
        if self.store is None or outside_cache(job):
            return True
        try:
            return self._record(self._key(job_dir, job)) is None
        except Exception:  # noqa: BLE001 -- the store failed: ``reuse`` asks again and reports it
            return True

    def _record(self, key: str) -> dict[str, bytes] | None:
        """``take`` once per key and build: ``expects_to_run`` and ``reuse`` read the store once between them."""
        with self._lock:
            if key in self._records:
                return self._records[key]
        files = take(self.store, key)
        with self._lock:
            self._records[key] = files
        return files

    def ran(self, job_dir: Path, job: Job, ok: bool) -> None:
        """The unit of ``job`` is done in ``job_dir``: the units of its key waiting in other targets go on."""
        with self._lock:
            owner = self._owners.get(self._key(job_dir, job))
        if owner is not None and owner.job_dir == job_dir:
            owner.ok = ok
            owner.done.set()

    def _key(self, job_dir: Path, job: Job) -> str:
        key = self._keys.get(job_dir)
        if key is None:
            key = self._keys[job_dir] = unit_key(job, self.stack)
        return key

    def _install_roots(self) -> list[str]:
        if self._roots is None:
            self._roots = install_roots()
        return self._roots

    def stop(self) -> None:
        """The build failed: units waiting for another target's unit give up instead of waiting for ever."""
        with self._lock:
            self._stopped = True
            owners = list(self._owners.values())
        for owner in owners:
            owner.done.set()

    def _done(self, job_dir: Path, written: UnitUse | None) -> bool:
        if written is None:
            return False
        with self._lock:
            self._written[job_dir] = written
        return True

    def keep(self, jobs: tuple[tuple[Path, Job], ...], cache_dir: Path) -> RecordCounts:
        """Record every unit of one target that ran, when its units account for every directory of ``cache_dir``."""
        logs = {job_dir: log_records(job_dir) for job_dir, _ in jobs}
        uses = {job_dir: UnitUse.of_log(records) for job_dir, records in logs.items()}
        reused = [self._written[d] for d, _ in jobs if d in self._written]
        counts = RecordCounts(reused=len(reused), kernels=sum(len(u.kernels) for u in reused),
                              modules=sum(len(u.modules) for u in reused))
        stray = unaccounted(cache_dir, list(uses.values()))
        if stray or self.store is None:
            why = f"{len(stray)} cache dir(s) no unit logged, e.g. {stray[0]}" if stray else None
            return replace(counts, not_kept=why, errors=self.errors())
        kept = 0
        for job_dir, job in jobs:
            if job_dir in self._written or outside_cache(job) or (device_bound_log(logs[job_dir])
                                                                  and not product_bound(job)):
                continue
            try:
                keep(self.store, self._key(job_dir, job), job_dir, uses[job_dir])
                kept += 1
            except Exception as exc:  # noqa: BLE001 -- the unit ran; only the next build misses out
                with self._lock:
                    self._errors.append(f"writing: {type(exc).__name__}: {exc}")
        return replace(counts, kept=kept, errors=self.errors())

    def errors(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(set(self._errors)))


def copy_unit(job_dir: Path, cache_dir: Path, into_job: Path, into_cache: Path) -> UnitUse | None:
    """Copy what a unit left in ``job_dir`` and ``cache_dir`` (its log, result and the entries it used) into
    another target's; the entries already there are kept. None when the unit left no result."""
    result = job_dir / "job.json.result"
    if not result.is_file():
        return None
    use = UnitUse.of_log(log_records(job_dir))
    written = []
    for key in sorted(use.keys):
        if not (into_cache / key).is_dir() and (cache_dir / key).is_dir():
            _copy_entry(cache_dir / key, into_cache / key)
            written.append(key)
    into_job.mkdir(parents=True, exist_ok=True)
    _write(into_job / "compiles.jsonl", (job_dir / "compiles.jsonl").read_bytes())
    _write(into_job / "job.json.result", result.read_bytes())
    return UnitUse(tuple(k for k in use.kernels if k in written), tuple(k for k in use.modules if k in written))


def _copy_entry(source: Path, folder: Path) -> None:
    """A cache entry into another cache dir, its group (if any) naming the copies, written last."""
    names = sorted(p.name for p in source.iterdir() if p.is_file())
    groups = [n for n in names if n.startswith("__grp__")]
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name not in groups:
            _write(folder / name, (source / name).read_bytes())
    for group in groups:
        children = json.loads((source / group).read_text())["child_paths"]
        moved = {name: str(folder / os.path.basename(path)) for name, path in children.items()}
        _write(folder / group, json.dumps({"child_paths": moved}).encode())
