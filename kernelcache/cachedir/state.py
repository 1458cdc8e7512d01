"""Where a cache dir is, its lock, and its install receipts (one frozen ``Receipt``, parsed here only)."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BundleManifestError, StorageError, UsageError
from ..hooks.kernelcache_records import append_line
from .layout import (
    INSTALLED,
    JOURNAL,
    LOCK,
    LOG,
    SKELETON,
    STAGING,
    STATE_DIR,
    TRITON_KEYS,
    cache_root,
)

if TYPE_CHECKING:  # parsed only where a receipt is read: `env` on every pod start needs no manifest classes
    from ..bundle.signature import SignatureInfo
    from ..format.manifest import Manifest

REMOVAL_SUFFIX = ".rm.json"  # journal/<digest>.rm.json: a removal's journal (journal/<digest>.json: an install's)


def lock_timeout() -> float:
    """Seconds a writer waits for another one's lock: KERNELCACHE_LOCK_TIMEOUT, default 600."""
    text = os.environ.get("KERNELCACHE_LOCK_TIMEOUT", "600")
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise UsageError(f"KERNELCACHE_LOCK_TIMEOUT must be a number of seconds, got {text!r}")
    return value


def _flock_at_once(path: str) -> int | None:
    """The state lock taken without waiting, as filelock's ``UnixFileLock`` takes it (``flock`` on the same file,
    which stays in place), so the two exclude each other; its descriptor. None when another process holds it or
    ``flock`` fails here: the caller then waits with filelock, which also knows file systems without ``flock``
    (a lock file this call created for nothing is removed first: filelock's fallback makes its own)."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return None
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)
    try:
        try:
            fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            fd, created = os.open(path, flags), False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if created and exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            with contextlib.suppress(OSError):
                os.unlink(path)
        return None
    return fd


def _unflock(fd: int) -> None:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Receipt:
    """What ``installed/<digest>.json`` says: bundle ``digest`` is installed here, every entry in place.

    ``manifest`` is the bundle's manifest, so an installed bundle can be checked (fingerprint, files,
    FlashInfer modules) without the bundle file. ``entries``: the directories it published, relative to
    the cache dir. ``choices_skipped``: why the install left the bundle's autotune choices out (timed on
    another GPU product); empty when it installed them or the bundle has none. ``signature``: who signed the
    bundle, as its install checked it (bundle/signature.py); None in receipts written before kernelcache checked
    signatures. ``bundle``, ``cache_dir``, ``installed_at`` and ``pid`` are for people reading it.
    """

    digest: str
    manifest: Manifest
    entries: tuple[str, ...] = ()
    bundle: str = ""
    cache_dir: str = ""
    installed_at: float = 0.0
    pid: int = 0
    signature: SignatureInfo | None = None
    choices_skipped: str = ""

    @property
    def choices(self) -> bool:
        """Whether the bundle's autotune choices were installed here."""
        return self.manifest.tuning is not None and not self.choices_skipped

    @functools.cached_property
    def uses(self) -> tuple[str, ...]:
        """The entries the bundle uses: those it published and the directory of every file its manifest lists
        that the install put in place (the same set for a receipt an install wrote), sorted."""
        files = self.manifest.files(choices=self.choices)
        return tuple(sorted({*self.entries, *(os.path.dirname(f.path) for f in files)}))

    def to_dict(self) -> dict[str, Any]:
        signature = {"signature": self.signature.to_dict()} if self.signature is not None else {}
        skipped = {"choices_skipped": self.choices_skipped} if self.choices_skipped else {}
        return {"digest": self.digest, "bundle": self.bundle, "cache_dir": self.cache_dir,
                "installed_at": self.installed_at, "pid": self.pid, "entries": list(self.entries),
                **signature, **skipped, "manifest": self.manifest.to_dict()}

    def to_json(self) -> str:
        # One line: json's C encoder (indent= runs the pure-Python one, ~0.2 s for a 400-kernel manifest).
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Any) -> Receipt:
        """The receipt ``data`` describes; ``ValueError`` (the one test of a bad receipt) when it does not."""
        if not isinstance(data, dict) or not isinstance(data.get("digest"), str) \
                or not isinstance(data.get("manifest"), dict):
            raise ValueError("not a receipt: needs a digest and a manifest")
        from ..format.manifest import Manifest

        try:
            manifest = Manifest.from_dict(data["manifest"])
        except BundleManifestError as exc:
            raise ValueError(f"its manifest is unreadable ({exc})") from None
        entries = data.get("entries", [])
        when = data.get("installed_at")
        pid = data.get("pid")
        return cls(data["digest"], manifest,
                   tuple(e for e in entries if isinstance(e, str)) if isinstance(entries, list) else (),
                   str(data.get("bundle", "")), str(data.get("cache_dir", "")),
                   float(when) if isinstance(when, int | float) and not isinstance(when, bool) else 0.0,
                   pid if isinstance(pid, int) and not isinstance(pid, bool) else 0, _signature(data.get("signature")),
                   str(data.get("choices_skipped") or ""))


def _signature(data: Any) -> SignatureInfo | None:
    """A receipt's signature record; None when it has none, or none that reads (it only informs people)."""
    if data is None:
        return None
    from ..bundle.signature import SignatureInfo

    try:
        return SignatureInfo.from_dict(data)
    except ValueError:
        return None


@dataclass(frozen=True)
class ReceiptScan:
    """Every receipt of a cache dir: the good ones newest first, and the paths of bad ones with why."""

    receipts: tuple[Receipt, ...] = ()
    bad: tuple[tuple[Path, str], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class CacheDir:
    """A cache directory (``root``, absolute) and kernelcache's state in it."""

    root: Path

    @classmethod
    def at(cls, cache_dir: str | os.PathLike | None) -> CacheDir:
        """The cache dir a verb was given (the default when None: ``layout.default_cache_root``), resolved once at the
        top: absolute, and a usage error when it is a file. Everything below takes this value."""
        path = Path(cache_root(cache_dir))
        if path.exists() and not path.is_dir():
            raise UsageError(f"cache dir {path} is a file, not a directory")
        return cls(path)

    @property
    def state(self) -> Path:
        return self.root / STATE_DIR

    @property
    def triton_keys(self) -> Path:
        """Kept ``triton_key()`` values: cachedir/fingerprints.py writes, hooks/kernelcache_tritonkey reads."""
        return self.state / TRITON_KEYS

    @property
    def staging(self) -> Path:
        """Where installs extract and removals move entries out, on the cache dir's filesystem."""
        return self.state / STAGING

    def ensure_state(self) -> Path:
        """Create the state dirs (a ``StorageError`` when the cache dir cannot be written)."""
        try:
            for sub in ("", *SKELETON):
                (self.state / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot write to {self.root}: {exc.strerror or exc}") from None
        return self.state

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the state lock; ``StorageError`` after KERNELCACHE_LOCK_TIMEOUT seconds of waiting."""
        timeout = lock_timeout()
        fd = _flock_at_once(str(self.state / LOCK))
        if fd is not None:
            try:
                yield
            finally:
                _unflock(fd)
            return
        from filelock import FileLock, Timeout  # 10-40 ms of imports: only to wait, or where flock is missing

        lock = FileLock(str(self.state / LOCK), timeout=timeout)
        try:
            lock.acquire()
        except Timeout:
            raise StorageError(f"timed out after {lock_timeout():.0f}s waiting for the lock on {self.root}") from None
        try:
            yield
        finally:
            lock.release()

    # -- receipts ---------------------------------------------------------------------------------

    def receipt_path(self, digest: str) -> Path:
        return self.state / INSTALLED / f"{digest}.json"

    def scan(self) -> ReceiptScan:
        good, bad = [], []
        for path in sorted((self.state / INSTALLED).glob("*.json")):
            try:
                good.append(Receipt.from_dict(json.loads(path.read_text())))
            except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
                bad.append((path, str(exc)))
        good.sort(key=lambda r: r.installed_at, reverse=True)
        return ReceiptScan(tuple(good), tuple(bad))

    def receipts(self) -> tuple[Receipt, ...]:
        """Every bundle installed here, newest first (bad receipts left out)."""
        return self.scan().receipts

    def receipt(self, digest: str) -> Receipt | None:
        return next((r for r in self.receipts() if r.digest == digest), None)

    def flashinfer_entries(self) -> list | None:
        """The raw ``flashinfer`` entries of every receipt's manifest, from the JSON alone: a 400-kernel receipt
        takes ~8 ms to decode and ~40 ms more to build into a ``Manifest``, and `env` runs on every pod start.
        None when a receipt is not JSON of that shape: the caller reads the receipts the full way."""
        found = []
        for path in sorted((self.state / INSTALLED).glob("*.json")):
            try:
                entries = json.loads(path.read_bytes())["manifest"].get("flashinfer", [])
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return None
            if not isinstance(entries, list):
                return None
            found += entries
        return found

    def installed_complete(self, digest: str, manifest: Manifest, choices: bool = True) -> bool:
        """The receipt is there and so is every file the bundle holds (``choices``: its autotune files too) and every
        file of the vLLM AOT directories its compile trees place (vllm_tree.py)."""
        if not self.receipt_path(digest).is_file():
            return False
        root = str(self.root)  # os.path on strings: a few hundred pathlib joins cost 10-20 ms
        if not all(os.path.exists(os.path.join(root, f.path)) for f in manifest.files(choices)):
            return False
        if manifest.engine is None:
            return True
        from .vllm_tree import absent

        return not absent(self.root, manifest)

    def choices_installed(self) -> bool:
        """Whether an installed bundle's autotune choices are in place (a receipt whose manifest has ``tuning`` and
        that skipped none). Read from the receipts' JSON alone, as ``flashinfer_entries`` reads them; a receipt of
        another shape sends it the full way."""
        for path in sorted((self.state / INSTALLED).glob("*.json")):
            try:
                data = json.loads(path.read_bytes())
                if data["manifest"].get("tuning") and not data.get("choices_skipped"):
                    return True
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return any(r.choices for r in self.receipts())
        return False

    # -- journals and the log ----------------------------------------------------------------------

    def journal_path(self, digest: str) -> Path:
        return self.state / JOURNAL / f"{digest}.json"

    def removal_path(self, digest: str) -> Path:
        return self.state / JOURNAL / f"{digest}{REMOVAL_SUFFIX}"

    def pending_journals(self) -> list[Path]:
        """Journals of installs a killed process left half-published and of removals it left half-done (``recover``
        finishes both)."""
        return sorted((self.state / JOURNAL).glob("*.json"))

    def log(self, record: dict) -> None:
        append_line(self.state / LOG, record)
