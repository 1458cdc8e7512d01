"""Install a bundle into a Triton cache directory: plan first, then execute atomically.

``plan_install`` only reads: the manifest, this environment's fingerprint, the visible GPUs and
what the cache already holds. It returns an ``InstallPlan`` that says what would happen and why a
bundle would be refused. ``InstallPlan.execute`` then, under a per-cache-dir file lock:

1. rolls forward an install a killed process left half-published, and removes stale staging dirs
   and temporary files;
2. returns at once if another process installed the same bundle meanwhile;
3. extracts into ``<cache>/.kernelcache/staging/`` (same filesystem), verifying every member's
   size and sha256 before anything is renamed;
4. checks each Triton group file and rewrites it to the final absolute paths;
5. writes, before publishing anything, a journal of the entries to publish and the receipt under a
   pending name (so the publish step allocates no space); renames each entry into place (a whole
   directory in one ``rename`` where the key is new; file by file, group file last, where Triton
   left a partial one; complete entries already there are left alone); renames the receipt into
   place; drops the journal.

What a reader can see (docs/RELIABILITY.md): never a partial entry, because Triton only trusts an
entry once its group file exists and every entry appears in one rename. The receipt, which is
what kernelcache itself trusts, appears only once every entry is in place. A kill during the
publish step can leave a subset of complete entries and a journal; the next kernelcache command
on that cache dir (install, env, run, activate) completes it. An ``OSError`` during the publish
step (a full disk, a permission change) moves the entries published so far back out, so the
cache is as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

from .bundle import archive
from .bundle.fingerprint import Difference, compare, compare_gpu, local_environment
from .bundle.manifest import Kernel, Manifest
from .errors import (
    ArchMismatch,
    BundleManifestError,
    EntryError,
    FingerprintMismatch,
    KernelcacheError,
    StorageError,
    UsageError,
)
from .harvest import KEY_PATTERN
from .plan.gpus import visible_gpus

STATE_DIR = ".kernelcache"


def lock_timeout() -> float:
    """Seconds an install waits for another one's lock: KERNELCACHE_LOCK_TIMEOUT, default 600."""
    text = os.environ.get("KERNELCACHE_LOCK_TIMEOUT", "600")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise UsageError(f"KERNELCACHE_LOCK_TIMEOUT must be a number of seconds, got {text!r}")
    return value


def default_cache_dir() -> Path:
    """Where Triton looks: KERNELCACHE_HOME, else TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache."""
    for var in ("KERNELCACHE_HOME", "TRITON_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(os.environ.get("TRITON_HOME") or Path.home()) / ".triton" / "cache"


def resolve_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    path = Path(os.path.abspath(cache_dir if cache_dir is not None else default_cache_dir()))
    if path.exists() and not path.is_dir():
        raise UsageError(f"cache dir {path} is a file, not a directory")
    return path


@dataclass(frozen=True)
class InstallResult:
    cache_dir: Path
    digest: str
    action: str  # "installed" | "already-installed"
    written: int = 0
    present: int = 0
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class InstallPlan:
    bundle: Path
    manifest: Manifest
    digest: str
    cache_dir: Path
    differences: tuple[Difference, ...] = ()
    force: bool = False
    limits: archive.Limits = field(default_factory=archive.Limits.from_env)

    @property
    def blocking(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.blocking)

    @property
    def already_installed(self) -> bool:
        return installed_complete(self.cache_dir, self.digest, self.manifest)

    def check(self) -> list[str]:
        """Raise if the bundle would miss here (unless forced); return warnings."""
        if self.blocking and not self.force:
            cls = ArchMismatch if all(d.field.startswith("gpu[") for d in self.blocking) else FingerprintMismatch
            raise cls(
                f"bundle {self.bundle.name} was built for another environment ({len(self.blocking)} field(s) "
                f"differ); its kernels would be recompiled here. --force installs it anyway",
                [(d.field, d.bundle, d.local) for d in self.blocking],
            )
        warnings = [f"{d.field}: bundle {d.bundle}, here {d.local} ({d.why})" for d in self.differences]
        if self.blocking:
            warnings.insert(0, "FORCED: installing a bundle whose fingerprint does not match; expect compiles")
        return warnings

    def execute(self) -> InstallResult:
        warnings = tuple(self.check())
        started = time.perf_counter()
        if self.already_installed:
            return InstallResult(self.cache_dir, self.digest, "already-installed", seconds=0.0, warnings=warnings)
        state = _state_dir(self.cache_dir)
        try:
            with FileLock(str(state / "lock"), timeout=lock_timeout()):
                recover(self.cache_dir, locked=True)
                if self.already_installed:
                    return InstallResult(self.cache_dir, self.digest, "already-installed",
                                         seconds=time.perf_counter() - started, warnings=warnings)
                written, present = _install_locked(self, state)
                if self.manifest.flashinfer:
                    _write_flashinfer_loader(self.cache_dir)
        except Timeout:
            waited = f"timed out after {lock_timeout():.0f}s waiting for the lock on {self.cache_dir}"
            raise StorageError(waited) from None
        except OSError as exc:
            raise StorageError(f"cannot install into {self.cache_dir}: {exc.strerror or exc}") from None
        return InstallResult(self.cache_dir, self.digest, "installed", written, present,
                             time.perf_counter() - started, warnings)


def plan_install(bundle: str | os.PathLike, cache_dir: str | os.PathLike | None = None, force: bool = False,
                 check_gpu: bool = True, limits: archive.Limits | None = None) -> InstallPlan:
    path = Path(bundle)
    lim = limits or archive.Limits.from_env()
    manifest = archive.read_manifest(path, lim)
    return plan_install_manifest(path, manifest, resolve_cache_dir(cache_dir), force, check_gpu, lim)


def plan_install_manifest(path: Path, manifest: Manifest, cache_dir: Path, force: bool = False,
                          check_gpu: bool = True, limits: archive.Limits | None = None) -> InstallPlan:
    """The plan for a bundle whose manifest is already read (from the file, or from a receipt)."""
    lim = limits or archive.Limits.from_env()
    check_entries(manifest)
    try:
        here = local_environment(manifest.environment.ptxas or [manifest.target.arch])
    except KernelcacheError:
        if not force:
            raise
        here = None
    differences = compare(manifest, here) if here is not None else []
    if check_gpu:
        differences += compare_gpu(manifest.target, visible_gpus())
    return InstallPlan(path, manifest, archive.bundle_digest(manifest), cache_dir, tuple(differences), force, lim)


def install_if_present(digest: str, cache_dir: str | os.PathLike | None = None, force: bool = False,
                       check_gpu: bool = True, source: str = "",
                       accept: Callable[[Manifest], None] | None = None) -> InstallResult | None:
    """The bundle ``digest`` is already installed in ``cache_dir``: check it against this environment
    (from its receipt's manifest) as an install would, and return the no-op result. ``None``: not there."""
    root = resolve_cache_dir(cache_dir)
    receipt = next((r for r in receipts(root) if r["digest"] == digest), None)
    if receipt is None:
        return None
    try:
        manifest = Manifest.from_dict(receipt["manifest"])
    except BundleManifestError:
        return None  # let a real install replace what its receipt no longer describes
    if archive.bundle_digest(manifest) != digest or not installed_complete(root, digest, manifest):
        return None
    if accept is not None:
        accept(manifest)
    plan = plan_install_manifest(Path(source or digest), manifest, root, force, check_gpu)
    return plan.execute()


def install(bundle: str | os.PathLike, cache_dir: str | os.PathLike | None = None, force: bool = False,
            check_gpu: bool = True, limits: archive.Limits | None = None) -> InstallResult:
    """Verify, check against this environment, and publish a bundle. Idempotent."""
    return plan_install(bundle, cache_dir, force, check_gpu, limits).execute()


# -- checks on what a bundle declares --------------------------------------------------------------


def check_entries(manifest: Manifest) -> None:
    """Every kernel and module lives in its own Triton key dir; a kernel has its metadata and group."""
    for item in (*manifest.kernels, *manifest.modules):
        kind = "kernel" if isinstance(item, Kernel) else "module"
        if not KEY_PATTERN.fullmatch(item.key):
            raise EntryError(f"{kind} key {item.key!r} is not a Triton cache key")
        names = {f.path for f in item.files}
        outside = sorted(p for p in names if os.path.dirname(p) != item.key)
        if outside:
            raise EntryError(f"{kind} {item.key} lists {outside[0]!r}, outside its own directory")
        if isinstance(item, Kernel):
            needed = {f"{item.key}/{item.name}.json", f"{item.key}/__grp__{item.name}.json"}
            if not needed <= names:
                raise EntryError(f"kernel {item.name} ({item.key}) lacks {sorted(needed - names)[0]!r}")


# -- state: receipts, journal, staging ------------------------------------------------------------


def _state_dir(cache_dir: Path) -> Path:
    state = cache_dir / STATE_DIR
    try:
        for sub in ("", "staging", "installed", "journal"):
            (state / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot write to {cache_dir}: {exc.strerror or exc}") from None
    return state


def receipt_path(cache_dir: Path, digest: str) -> Path:
    return cache_dir / STATE_DIR / "installed" / f"{digest}.json"


def receipts(cache_dir: Path) -> list[dict]:
    """Every bundle installed into this cache dir, newest first (unreadable receipts left out)."""
    return read_receipts(cache_dir)[0]


def read_receipts(cache_dir: Path) -> tuple[list[dict], list[Path]]:
    """(well-formed receipts newest first, paths of receipts that are not)."""
    found, bad = [], []
    for path in sorted((Path(cache_dir) / STATE_DIR / "installed").glob("*.json")):
        try:
            receipt = json.loads(path.read_text())
        except (OSError, ValueError):
            receipt = None
        well_formed = (isinstance(receipt, dict) and isinstance(receipt.get("digest"), str)
                       and isinstance(receipt.get("manifest"), dict))
        if well_formed:
            found.append(receipt)
        else:
            bad.append(path)
    order = sorted(found, key=lambda r: r.get("installed_at", 0) if isinstance(r.get("installed_at"), int | float)
                   else 0, reverse=True)
    return order, bad


def entry_dirs(manifest: Manifest) -> list[str]:
    """The directories a bundle publishes, relative to the cache root (one per kernel or module)."""
    return sorted({os.path.dirname(f.path) for f in manifest.files()})


def installed_complete(cache_dir: Path, digest: str, manifest: Manifest) -> bool:
    if not receipt_path(cache_dir, digest).is_file():
        return False
    return all(os.path.exists(cache_dir / f.path) for f in manifest.files())


def pending_journals(cache_dir: Path) -> list[Path]:
    """Journals of installs a killed process left half-published (``recover`` finishes them)."""
    return sorted((Path(cache_dir) / STATE_DIR / "journal").glob("*.json"))


def recover(cache_dir: Path, locked: bool = False) -> int:
    """Finish publishes a killed install left behind; drop staging dirs and temp files no journal needs."""
    state = Path(cache_dir) / STATE_DIR
    if not (state / "journal").is_dir():
        return 0
    if not locked:
        try:
            with FileLock(str(state / "lock"), timeout=lock_timeout()):
                return recover(cache_dir, locked=True)
        except Timeout:
            raise StorageError(f"timed out after {lock_timeout():.0f}s waiting for the lock on {cache_dir}") from None
        except OSError as exc:
            raise StorageError(f"cannot finish an interrupted install in {cache_dir}: {exc.strerror or exc}") from None
    finished = sum(_roll_forward(Path(cache_dir), state, journal) for journal in pending_journals(cache_dir))
    _sweep(state)
    return finished


def _roll_forward(cache_dir: Path, state: Path, journal: Path) -> int:
    try:
        record = json.loads(journal.read_text())
        staging = state / "staging" / Path(record["staging"]).name
        entries, receipt = record["entries"], record["receipt"]
    except (OSError, ValueError, KeyError, TypeError):
        journal.unlink(missing_ok=True)  # torn before its rename: nothing was published under it
        return 0
    _publish(cache_dir, staging, entries, [])
    if all(_complete(cache_dir / rel) for rel in entries):
        _write_receipt(cache_dir, receipt)
    journal.unlink()
    return 1


def _sweep(state: Path) -> None:
    """Remove staging dirs and temporary files; only the lock holder calls this."""
    for stale in sorted((state / "staging").iterdir()) if (state / "staging").is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)
    for sub in ("journal", "installed"):
        for temp in (state / sub).glob(".*"):
            temp.unlink(missing_ok=True)


def _install_locked(plan: InstallPlan, state: Path) -> tuple[int, int]:
    staging = state / "staging" / f"{plan.digest[:16]}-{os.getpid()}"
    journal = state / "journal" / f"{plan.digest}.json"
    try:
        archive.extract(plan.bundle, staging, plan.limits)
        _relocate_groups(plan.manifest, staging, plan.cache_dir)
        entries = entry_dirs(plan.manifest)
        receipt = {
            "digest": plan.digest,
            "bundle": str(plan.bundle),
            "cache_dir": str(plan.cache_dir),
            "installed_at": time.time(),
            "pid": os.getpid(),
            "entries": entries,
            "manifest": plan.manifest.to_dict(),
        }
        pending = receipt_path(plan.cache_dir, plan.digest).with_name(f".{plan.digest}.json.pending")
        _atomic_write(pending, json.dumps(receipt, indent=1).encode())
        try:
            _atomic_write(journal, json.dumps({"staging": staging.name, "entries": entries,
                                               "receipt": receipt}).encode())
        except BaseException:
            pending.unlink(missing_ok=True)  # no journal, nothing published: leave no receipt-sized file either
            raise
        written, present = _publish_or_undo(plan.cache_dir, staging, entries, pending, journal)
    finally:
        # A journal still there means publishing began and was cut short (Ctrl-C, SIGTERM, an undo that
        # failed): its staging dir is what the next command's roll-forward publishes, so it stays.
        if not journal.exists():
            shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):  # the install is complete; a full disk only loses the log line
        _log(state, {"event": "extracted", "digest": plan.digest, "pid": os.getpid(), "written": written,
                     "present": present, "time": time.time()})
    return written, present


def _write_flashinfer_loader(cache_dir: Path) -> None:
    """Generate FlashInfer's provider registration now, while the cache dir is writable."""
    from .runtime.flashinfer import write_site  # lazy: runtime code that must run at install time

    write_site(cache_dir)


def _publish_or_undo(cache_dir: Path, staging: Path, entries: list[str], pending: Path,
                     journal: Path) -> tuple[int, int]:
    """Publish, then the receipt; on an OSError move back what this call published, then re-raise."""
    moved: list[tuple[Path, Path]] = []
    try:
        counts = _publish(cache_dir, staging, entries, moved)
        os.replace(pending, pending.with_name(pending.name.removeprefix(".").removesuffix(".pending")))
    except OSError:
        if _undo(moved):
            journal.unlink(missing_ok=True)
            pending.unlink(missing_ok=True)
        raise
    journal.unlink()
    return counts


def _undo(moved: list[tuple[Path, Path]]) -> bool:
    """Move published entries back into staging. False: the journal must stay to roll forward."""
    try:
        for source, target in reversed(moved):
            os.rename(target, source)
    except OSError:
        return False
    return True


def _relocate_groups(manifest: Manifest, staging: Path, cache_dir: Path) -> None:
    """Check every group file and point its children at the final absolute paths (Triton's group files
    name their children by absolute path, so a moved cache would miss)."""
    for kernel in manifest.kernels:
        group = staging / kernel.key / f"__grp__{kernel.name}.json"
        present = {os.path.basename(f.path) for f in kernel.files}
        children = _group_children(group, kernel)
        final = {}
        for name, rel in children.items():
            base = os.path.basename(rel)
            if base not in present or base.startswith("__grp__"):
                raise EntryError(f"group file of kernel {kernel.name} ({kernel.key}) names {rel!r}, not in its entry")
            final[name] = str(cache_dir / kernel.key / base)
        if f"{kernel.name}.json" not in final:
            raise EntryError(f"group file of kernel {kernel.name} ({kernel.key}) does not list {kernel.name}.json")
        group.write_text(json.dumps({"child_paths": final}))


def _group_children(group: Path, kernel: Kernel) -> dict[str, str]:
    try:
        children = json.loads(group.read_text())["child_paths"]
    except (ValueError, KeyError, TypeError) as exc:
        raise EntryError(f"group file of kernel {kernel.name} ({kernel.key}) is malformed: {exc!r}") from None
    if not isinstance(children, dict) or not all(isinstance(v, str) for v in children.values()):
        raise EntryError(f"group file of kernel {kernel.name} ({kernel.key}) has no child_paths mapping")
    return children


def _publish(cache_dir: Path, staging: Path, entries: list[str], moved: list[tuple[Path, Path]]) -> tuple[int, int]:
    """Move each staged entry into the cache; record whole-directory moves in ``moved``."""
    written = present = 0
    for rel in entries:
        source, target = staging / rel, cache_dir / rel
        if not source.exists():
            present += 1  # published before a kill; the journal replay finds it gone from staging
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            try:
                os.rename(source, target)
                moved.append((source, target))
                written += 1
                continue
            except OSError:
                if not target.exists():
                    raise
        if _complete(target):
            present += 1
        else:
            _merge_into(source, target)
            written += 1
    return written, present


def _complete(entry: Path) -> bool:
    """A Triton entry with a readable group file whose children all exist, or a module dir."""
    if not entry.is_dir():
        return False
    groups = list(entry.glob("__grp__*.json"))
    if not groups:
        files = [p for p in entry.iterdir() if p.is_file()]
        return bool(files) and all(p.suffix == ".so" for p in files)
    try:
        return all(
            os.path.exists(p)
            for group in groups
            for p in json.loads(group.read_text())["child_paths"].values()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _merge_into(source: Path, target: Path) -> None:
    """Fill a partial entry file by file, the group file last, each with an atomic replace."""
    files = sorted(source.iterdir(), key=lambda p: (p.name.startswith("__grp__"), p.name))
    for path in files:
        os.replace(path, target / path.name)


def _write_receipt(cache_dir: Path, receipt: dict) -> None:
    _atomic_write(receipt_path(cache_dir, receipt["digest"]), json.dumps(receipt, indent=1).encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _log(state: Path, record: dict) -> None:
    with open(state / "log.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
