"""Cache management, as ``hf cache`` does for models: what is installed in a cache dir (``ls``), removing one
bundle (``rm``), and removing what no longer serves this environment (``prune``).

``ls`` only reads. ``rm`` and ``prune`` write under the cache dir's state lock, after finishing whatever a killed
install or removal left (``recover``), and remove a bundle through a removal journal (``withdraw`` in
cachedir/publish.py): its receipt goes first, then each entry no other installed bundle lists is renamed whole out
of the cache and deleted. So a reader finds each entry complete or absent, never partial; an entry another
installed bundle lists is never removed; and a kill at any point leaves a journal that the next kernelcache command
(``install``, ``env``, ``run``, ``rm``, ``prune``) finishes. A bundle's entries are those its receipt lists and the
AOT directories its vLLM compile artifacts placed under ``<cache dir>/vllm`` (``VLLM_CACHE_ROOT``); what vLLM itself
wrote there is left alone.

A bundle "matches" when its fingerprint (Python, Triton, ``triton_key()``, ptxas, the key variables, vLLM,
FlashInfer) has no blocking difference from this environment's, the check ``install`` makes (the visible GPU is
not compared: a cache dir may serve several). "Last served" is when ``env``, ``run`` or ``activate()`` last served
the cache dir while the bundle was installed: the newest served record's mtime (runtime/served.py), kept only where
the cache dir is writable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bundle.signature import SignatureInfo, signature_info
from .cachedir import STATE_DIR, CacheDir, Receipt, recover
from .cachedir.checked import record_holds as checked_record_holds
from .cachedir.layout import CHECKED, SERVED, kept_records, leftover_names
from .cachedir.publish import withdraw
from .cachedir.vllm_tree import absent
from .errors import KernelcacheError, NotACacheDir, NotInstalled, StorageError, UsageError
from .format.envscan import distribution_version
from .format.fingerprint import compare
from .format.manifest import Manifest
from .install import environment_here
from .runtime.served import last_served
from .runtime.served import record_holds as served_record_holds

MAX_AGE_DAYS = 30.0  # prune: kept records unused for longer go
_DAY = 86400.0


@dataclass(frozen=True)
class SharedWith:
    """Another installed bundle that lists some of the same entries."""

    name: str
    digest: str
    entries: int

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class InstalledBundle:
    """One bundle installed in a cache dir, as ``kernelcache ls`` shows it."""

    name: str  # the bundle file's name without .tar.zst (else the recipe, arch and GPU; else the digest)
    digest: str
    arch: str
    gpu: str | None  # the GPU profile it was built for (None: any of the arch)
    kernels: int  # kernel variants
    modules: int  # prebuilt launchers and cuda_utils
    flashinfer: int  # FlashInfer modules
    entries: int  # directories it installed
    size_on_disk: int  # bytes its entries take (blocks allocated)
    exclusive_size: int  # bytes of the entries no other installed bundle lists: what `rm` frees
    installed_at: float  # seconds since the epoch
    last_served: float | None  # when the cache dir was last served with it installed; None: not since
    matches: bool | None  # its fingerprint matches this environment's; None: this one could not be taken
    differences: tuple[str, ...]  # the fields that differ and block (``field: bundle -> here``)
    shared_with: tuple[SharedWith, ...]  # the other installed bundles it shares entries with
    shared_entries: int  # its entries another installed bundle also lists
    missing_files: int  # files of its manifest and of its vLLM AOT directories that are not there (0: complete)
    bundle: str  # the file it was installed from
    signature: SignatureInfo  # who signed it, as its install checked it (``unrecorded``: installed before that)
    tuned_on: str | None = None  # where its autotune choices were timed (product, driver, clocks); None: not tuned
    choices: int = 0  # autotune choices it installed here
    choices_skipped: str = ""  # why the install left its choices out (timed on another GPU product)
    flashinfer_modules: tuple[str, ...] = ()  # the FlashInfer modules' names ("sampling", attention modules' URIs)
    serve: str = ""  # the serve command it was built for ("" : built from a recipe's plan alone)
    config_hash: str = ""  # vLLM's VllmConfig.compute_hash() for that command

    @property
    def size_on_disk_str(self) -> str:
        from .bundle.inspect import human_size

        return human_size(self.size_on_disk)

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class CacheListing:
    """What ``ls`` found: the bundles (newest install first), the bytes their entries take together, and
    problems noticed on the way (unreadable receipts, an unfinished install, no fingerprint here)."""

    cache_dir: Path
    bundles: tuple[InstalledBundle, ...]
    size_on_disk: int
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class Removed:
    """One bundle ``rm`` or ``prune`` removed (or, in a dry run, would remove)."""

    name: str
    digest: str
    removed: tuple[str, ...]  # its entries that went (no other installed bundle listed them)
    kept: tuple[str, ...]  # its entries that stayed: another installed bundle lists them
    freed: int  # bytes
    differences: tuple[str, ...] = ()  # prune: why it no longer matches
    stuck: tuple[str, ...] = ()  # entries that could not be renamed out (a mount point, a permission): still there

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class RemoveResult:
    cache_dir: Path
    bundle: Removed
    seconds: float

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class PruneResult:
    """What ``prune`` removed, or with ``dry_run`` would remove: bundles whose fingerprint no longer matches,
    what killed installs or removals left (finished or swept), and kept records that are stale or unused."""

    cache_dir: Path
    dry_run: bool
    bundles: tuple[Removed, ...]
    leftovers: tuple[str, ...]  # under .kernelcache/: journals, staging dirs, temporary files
    records: tuple[str, ...]  # under .kernelcache/: served and checked records
    seconds: float

    @property
    def freed(self) -> int:
        return sum(b.freed for b in self.bundles)

    def to_dict(self) -> dict:
        return {**_plain(self), "freed": self.freed}


def _plain(value: Any) -> Any:
    """A result as JSON data: dataclasses become dicts, tuples lists, paths strings."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value


# -- ls ----------------------------------------------------------------------------------------------


def ls(cache_dir: str | os.PathLike | None = None) -> CacheListing:
    """The bundles installed in ``cache_dir`` (default as ``kernelcache install``). Reads only."""
    cache = _existing(CacheDir.at(cache_dir))
    scan = cache.scan()
    warnings = [f"{path.name} is not a readable install receipt ({why}); its entries are unknown"
                for path, why in scan.bad]
    if next(leftover_names(os.fspath(cache.state)), None) is not None:
        warnings.append("an interrupted install or removal is pending: the next kernelcache command on this cache "
                        "dir finishes it")
    found = _Inventory.of(cache, scan.receipts)
    fingerprints = _Fingerprints(cache)
    bundles = tuple(found.listed(r, fingerprints.differences(r.manifest)) for r in scan.receipts)
    if fingerprints.failure:
        warnings.append(f"cannot take this environment's fingerprint ({fingerprints.failure}); matches unknown")
    return CacheListing(cache.root, bundles, sum(found.sizes.values()), tuple(warnings))


@dataclass(frozen=True)
class _Inventory:
    """What ``ls`` takes once for all bundles: each bundle's name, the bundles that list each entry, each entry's
    size, and when the cache dir was last served."""

    root: Path
    names: dict[str, str]  # digest -> name
    uses: dict[str, tuple[str, ...]]  # digest -> entries (``_uses``)
    users: dict[str, list[str]]  # entry -> digests
    sizes: dict[str, int]  # entry -> bytes
    served: float | None

    @classmethod
    def of(cls, cache: CacheDir, receipts: tuple[Receipt, ...]) -> _Inventory:
        uses = _all_uses(cache.root, receipts)
        users = _users(uses)
        return cls(cache.root, {r.digest: _name(r) for r in receipts}, uses, users,
                   {entry: _entry_size(cache.root / entry) for entry in users}, last_served(cache.root))

    def listed(self, receipt: Receipt, differences: tuple[str, ...] | None) -> InstalledBundle:
        manifest, uses = receipt.manifest, self.uses[receipt.digest]
        own = [e for e in uses if len(self.users[e]) == 1]
        served = self.served if self.served is not None and self.served >= receipt.installed_at else None
        files = manifest.files(receipt.choices)
        missing = sum(not os.path.exists(os.path.join(self.root, f.path)) for f in files)
        missing += len(absent(self.root, manifest))  # its vLLM AOT directories' files
        tuning = manifest.tuning
        return InstalledBundle(
            self.names[receipt.digest], receipt.digest, manifest.target.arch, manifest.target.gpu,
            len(manifest.kernels), len(manifest.modules), len(manifest.flashinfer), len(uses),
            sum(self.sizes[e] for e in uses), sum(self.sizes[e] for e in own), receipt.installed_at, served,
            None if differences is None else not differences, differences or (), self.shared(receipt),
            len(uses) - len(own), missing, receipt.bundle, signature_info(receipt),
            tuning.where() if tuning else None, len(tuning.files) if receipt.choices else 0,
            receipt.choices_skipped, tuple(m.name for m in manifest.flashinfer), *built_for(manifest))

    def shared(self, receipt: Receipt) -> tuple[SharedWith, ...]:
        """The other bundles that list entries of ``receipt``, the most shared first."""
        others = Counter(d for e in self.uses[receipt.digest] for d in self.users[e] if d != receipt.digest)
        order = sorted(others.items(), key=lambda item: (-item[1], self.names[item[0]]))
        return tuple(SharedWith(self.names[d], d, n) for d, n in order)


def built_for(manifest: Manifest) -> tuple[str, str]:
    """(the serve command, vLLM's config hash) a bundle records in its plan (plan/serve.py ``served_record``); empty
    where it has none."""
    from .plan.serve import served_record  # the families' registry: only where a plan is read

    served = served_record(manifest.build.plan) or {}
    return str(served.get("command", "")), str(served.get("config_hash", ""))


class _Fingerprints:
    """This environment's fingerprint compared with bundles' (``install``'s check), the failure said once."""

    def __init__(self, cache: CacheDir):
        self.cache = cache
        self.failure: str | None = None

    def differences(self, manifest: Manifest) -> tuple[str, ...] | None:
        """The blocking differences; None when this environment's fingerprint cannot be taken."""
        if self.failure is not None:
            return None
        try:
            return blocking_differences(self.cache, manifest)
        except KernelcacheError as exc:
            self.failure = str(exc)
            return None


def blocking_differences(cache: CacheDir, manifest: Manifest) -> tuple[str, ...]:
    """What ``install`` would refuse ``manifest`` for here, GPU aside (``field: bundle -> here``): its fingerprint's
    fields, and the versions its vLLM compile records pin (enginecompile.py ``stale``; the served command and the
    server's ``VLLM_*`` variables, which this process does not know, are install's and verify's to compare)."""
    here = environment_here(manifest.environment.ptxas or [manifest.target.arch], cache, manifest).environment
    tvm_ffi = distribution_version("apache-tvm-ffi") if manifest.flashinfer else None
    found = [f"{d.field}: {d.bundle} -> {d.local}" for d in compare(manifest, here, tvm_ffi=tvm_ffi) if d.blocking]
    if manifest.engine is not None:
        from .enginecompile import stale

        found += [f"compile.{key}: {bundle} -> {local}" for key, bundle, local in stale(cache.root, manifest)]
    return tuple(found)


# -- rm ----------------------------------------------------------------------------------------------


def rm(bundle: str, cache_dir: str | os.PathLike | None = None) -> RemoveResult:
    """Remove the installed bundle named ``bundle`` (its name as ``ls`` shows it, its digest, or a prefix of at
    least 8 digits of it) and the entries no other installed bundle lists."""
    cache = _writable(CacheDir.at(cache_dir))
    started = time.perf_counter()
    with _locked(cache, "remove from"):
        recover(cache, locked=True)
        receipts = _readable(cache)
        receipt = _find(receipts, bundle, cache.root)
        [removed] = _remove(cache, [receipt], receipts)
    return RemoveResult(cache.root, removed, time.perf_counter() - started)


def _find(receipts: tuple[Receipt, ...], which: str, root: Path) -> Receipt:
    found = [r for r in receipts if _name(r) == which]
    if not found and len(which) >= 8:
        found = [r for r in receipts if r.digest.startswith(which.lower())]
    if not found:
        raise NotInstalled(f"no bundle named or with digest {which!r} is installed in {root} (kernelcache ls "
                           "lists them)")
    if len(found) > 1:
        raise NotInstalled(f"{which!r} names {len(found)} bundles installed in {root} "
                           f"({', '.join(r.digest[:16] for r in found)}); give the digest")
    return found[0]


def _remove(cache: CacheDir, doomed: list[Receipt], receipts: tuple[Receipt, ...]) -> list[Removed]:
    """Remove ``doomed`` one by one (the lock held), each with the entries no bundle still installed lists."""
    done = []
    for receipt, gone, kept in _split(cache, doomed, receipts):
        planned = _sized(cache, receipt, gone, kept)  # sized before it goes
        stuck = withdraw(cache, receipt.digest, gone)
        done.append(dataclasses.replace(planned, removed=tuple(e for e in gone if e not in stuck), stuck=stuck,
                                        freed=planned.freed - sum(_entry_size(cache.root / e) for e in stuck)))
        with contextlib.suppress(OSError):  # the removal is complete; a full disk only loses the log line
            cache.log({"event": "removed", "digest": receipt.digest, "pid": os.getpid(), "removed": len(gone),
                       "kept": len(kept), "time": time.time()})
    return done


def _split(cache: CacheDir, doomed: list[Receipt],
           receipts: tuple[Receipt, ...]) -> list[tuple[Receipt, list[str], list[str]]]:
    """For each bundle of ``doomed`` in turn: (its receipt, the entries that go, the entries that stay), as if the
    ones before it were gone already."""
    uses = _all_uses(cache.root, (*receipts, *doomed))
    remaining = {r.digest: r for r in receipts}
    plan = []
    for receipt in doomed:
        remaining.pop(receipt.digest, None)
        used = {e for digest in remaining for e in uses[digest]}
        plan.append((receipt, [e for e in uses[receipt.digest] if e not in used],
                     [e for e in uses[receipt.digest] if e in used]))
    return plan


# -- prune -------------------------------------------------------------------------------------------


def prune(cache_dir: str | os.PathLike | None = None, dry_run: bool = False,
          max_age_days: float = MAX_AGE_DAYS) -> PruneResult:
    """Remove the bundles whose fingerprint no longer matches this environment (with their entries no other
    installed bundle lists), finish or sweep what killed installs and removals left, and drop served and checked
    records that can never answer again or went unused for ``max_age_days`` (the newest served record stays: it
    says when the cache dir was last served). ``dry_run``: only say what, writing nothing."""
    cache = CacheDir.at(cache_dir)
    cache = _existing(cache) if dry_run else _writable(cache)
    started = time.perf_counter()
    receipts = _readable(cache)
    differences = {r.digest: blocking_differences(cache, r.manifest) for r in receipts}  # outside the lock: slow
    if dry_run:
        mismatched = [r for r in receipts if differences[r.digest]]
        removed = [_sized(cache, r, gone, kept) for r, gone, kept in _split(cache, mismatched, receipts)]
        return PruneResult(cache.root, True, _explained(removed, differences), tuple(leftover_names(str(cache.state))),
                           tuple(_stale_records(cache, max_age_days)), time.perf_counter() - started)
    with _locked(cache, "prune"):
        leftovers = tuple(leftover_names(str(cache.state)))
        recover(cache, locked=True)
        receipts = _readable(cache)  # as they are now: a bundle installed meanwhile is kept, unchecked
        removed = _remove(cache, [r for r in receipts if differences.get(r.digest)], receipts)
        records = _stale_records(cache, max_age_days)
        for path in records:
            (cache.state / path).unlink(missing_ok=True)
    return PruneResult(cache.root, False, _explained(removed, differences), leftovers, tuple(records),
                       time.perf_counter() - started)


def _sized(cache: CacheDir, receipt: Receipt, gone: list[str], kept: list[str]) -> Removed:
    return Removed(_name(receipt), receipt.digest, tuple(gone), tuple(kept),
                   sum(_entry_size(cache.root / e) for e in gone))


def _explained(removed: Iterable[Removed], differences: dict[str, tuple[str, ...]]) -> tuple[Removed, ...]:
    return tuple(dataclasses.replace(r, differences=differences[r.digest]) for r in removed)


def _stale_records(cache: CacheDir, max_age_days: float) -> list[str]:
    """Served and checked records (relative to the state dir) that can never answer again or went unused for
    ``max_age_days`` (a served record's mtime is its last use; a checked record's, the check that wrote it: a no-op
    install writes nothing). The newest served record stays whatever it holds: its
    mtime is when the cache dir was last served (``ls``)."""
    oldest = time.time() - max_age_days * _DAY
    stale = []
    for sub, holds in ((SERVED, served_record_holds), (CHECKED, checked_record_holds)):
        found = kept_records(os.fspath(cache.root), sub)
        for path, mtime in found[1:] if sub == SERVED else found:
            if mtime < oldest or not holds(path):
                stale.append(f"{sub}/{os.path.basename(path)}")
    return stale


# -- shared ------------------------------------------------------------------------------------------


def _existing(cache: CacheDir) -> CacheDir:
    """The cache dir, which must exist and hold kernelcache's state (``NotACacheDir`` otherwise)."""
    root = cache.root
    if not root.is_dir():
        raise NotACacheDir(f"cache dir {root} does not exist")
    if not cache.state.is_dir():
        raise NotACacheDir(f"{root} is not a kernelcache cache dir: it has no {STATE_DIR}/ (kernelcache install "
                           "makes one)")
    return cache


def _writable(cache: CacheDir) -> CacheDir:
    cache = _existing(cache)
    if not (os.access(cache.root, os.W_OK) and os.access(cache.state, os.W_OK)):
        raise StorageError(f"cannot remove anything from {cache.root}: it is read-only here")
    return cache


@contextmanager
def _locked(cache: CacheDir, what: str) -> Iterator[None]:
    """The state lock, with every file-system error inside turned into one ``StorageError`` line."""
    cache.ensure_state()
    try:
        with cache.locked():
            yield
    except OSError as exc:
        raise StorageError(f"cannot {what} {cache.root}: {exc.strerror or exc}") from None


def _readable(cache: CacheDir) -> tuple[Receipt, ...]:
    """Every receipt; ``NotACacheDir`` when one does not parse: the entries it lists are unknown, so no entry can
    be known to be unused."""
    scan = cache.scan()
    if scan.bad:
        path, why = scan.bad[0]
        raise NotACacheDir(f"install receipt {path} is unreadable ({why}): which entries it lists is unknown, so "
                           "nothing is removed; install its bundle again or delete the receipt")
    return scan.receipts


def _all_uses(root: Path, receipts: Iterable[Receipt]) -> dict[str, tuple[str, ...]]:
    """Digest -> the entries the bundle uses: those its receipt lists and the AOT directories its compile artifacts
    placed under ``vllm/`` (cachedir/vllm_tree.py ``installed_dirs``; a receipt written before installs listed them),
    which it owns like its Triton entries."""
    from .cachedir.vllm_tree import installed_dirs

    return {r.digest: tuple(sorted({*r.uses, *installed_dirs(root, r.manifest)})) for r in receipts}


def _users(uses: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """Entry -> the digests of the installed bundles that use it."""
    users: dict[str, list[str]] = {}
    for digest, entries in uses.items():
        for entry in entries:
            users.setdefault(entry, []).append(digest)
    return users


def _entry_size(entry: Path) -> int:
    """Bytes allocated to the files of one entry dir, its subdirectories' too (vLLM's AOT directories nest; Triton's
    entries are flat); 0 when it is gone."""
    total = 0
    try:
        with os.scandir(entry) as found:
            for item in found:
                if item.is_file(follow_symlinks=False):
                    total += item.stat(follow_symlinks=False).st_blocks * 512
                elif item.is_dir(follow_symlinks=False):
                    total += _entry_size(Path(item.path))
    except OSError:
        return total
    return total


def _name(receipt: Receipt) -> str:
    """The name ``ls`` shows and ``rm`` takes: the bundle file's name without ``.tar.zst``; else the recipe's name
    with the target; else the digest's first 16 digits."""
    stem = os.path.basename(receipt.bundle).removesuffix(".zst").removesuffix(".tar")
    if stem and stem != receipt.digest:
        return stem
    plan = receipt.manifest.build.plan or {}
    target = receipt.manifest.target
    if isinstance(plan.get("name"), str) and plan["name"]:
        return "-".join(p for p in (plan["name"], target.arch, target.gpu) if p)
    return receipt.digest[:16]


# -- the build cache ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildCacheListing:
    """What ``ls --build-cache`` found in a local build cache (buildcache/store.py ``DirStore``)."""

    location: Path
    entries: int  # kernels and helper modules, one blob each
    size_on_disk: int  # bytes their blobs take (blocks allocated)
    oldest_use: float | None  # when the least recently used entry was last written or reused
    newest_use: float | None

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class BuildCachePruneResult:
    """What ``prune --build-cache --max-size`` removed (or, in a dry run, would remove): the least recently used
    entries, until the rest fit ``max_size``."""

    location: Path
    dry_run: bool
    max_size: int
    removed: int
    freed: int
    entries: int  # left
    size_on_disk: int  # left

    def to_dict(self) -> dict:
        return _plain(self)


def ls_build_cache(build_cache: str | os.PathLike | None = None) -> BuildCacheListing:
    """The entries of a local build cache (default: the one ``build`` uses) and the bytes they take. Reads only."""
    store = _build_cache_store(build_cache)
    blobs = store.blobs()
    return BuildCacheListing(store.root, len(blobs), sum(b.size for b in blobs),
                             blobs[0].used if blobs else None, blobs[-1].used if blobs else None)


def prune_build_cache(max_size: int | str, build_cache: str | os.PathLike | None = None,
                      dry_run: bool = False) -> BuildCachePruneResult:
    """Remove the least recently used entries of a local build cache until the rest take at most ``max_size`` bytes
    (``"10G"`` works too). A build that reads an entry while it goes still reads it whole, or compiles the kernel."""
    from .format.archive import parse_size

    limit = parse_size(max_size) if isinstance(max_size, str) else int(max_size)
    store = _build_cache_store(build_cache)
    blobs = store.blobs()
    total = sum(b.size for b in blobs)
    removed = freed = 0
    for blob in blobs:  # least recently used first
        if total - freed <= limit:
            break
        if dry_run or store.remove(blob):
            removed, freed = removed + 1, freed + blob.size
    return BuildCachePruneResult(store.root, dry_run, limit, removed, freed, len(blobs) - removed, total - freed)


def _build_cache_store(build_cache: str | os.PathLike | None):
    from .buildcache import resolve
    from .buildcache.store import DirStore

    spec = resolve(build_cache)
    if spec is None:
        raise UsageError("no build cache: KERNELCACHE_BUILD_CACHE is off (name one with --build-cache DIR)")
    if spec.kind != "dir":
        raise UsageError(f"{spec.location}: ls and prune --build-cache take a local directory; a shared build cache "
                         "is trimmed by its store's own rules (bucket lifecycle, registry retention)")
    if os.path.exists(spec.location) and not os.path.isdir(spec.location):
        raise UsageError(f"--build-cache {spec.location} is not a directory")
    return DirStore(spec.location)
