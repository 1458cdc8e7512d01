"""Publishing staged entries into a cache dir, the journal that makes it survive a kill, and recovery.

An install writes, before it publishes anything, a ``Journal``: the staging dir, the entries to
publish and the receipt to write. Publishing renames each staged entry into place -- a whole
directory in one ``rename`` where the key is new; file by file, group file last, where Triton left a
partial one; complete entries already there are left alone. A reader never sees a partial entry:
Triton trusts an entry only once its group file exists (``FileCacheManager.put_group`` in
triton/runtime/cache.py writes it last), and each new entry appears in one rename.

``recover`` (under the lock) rolls every journal forward: it publishes what its staging dir still
holds, writes the receipt once every entry is complete, and drops the journal; then ``sweep``
removes staging dirs and temporary files no journal needs.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import StorageError
from ..runtime.site.kernelcache_prebuilt import SOURCE_SUFFIX
from .layout import SWEPT, unfinished
from .state import CacheDir, Receipt


@dataclass(frozen=True)
class Journal:
    """An install's intent, written before its first rename: roll it forward after a kill."""

    staging: str  # the staging dir's name under .kernelcache/staging/
    entries: tuple[str, ...]
    receipt: Receipt

    def to_json(self) -> str:
        return json.dumps({"staging": self.staging, "entries": list(self.entries), "receipt": self.receipt.to_dict()})

    @classmethod
    def read(cls, path: Path) -> Journal:
        """``ValueError`` when the journal is torn (cut short before its rename) or not one of ours."""
        try:
            data = json.loads(path.read_text())
            return cls(Path(data["staging"]).name, tuple(data["entries"]), Receipt.from_dict(data["receipt"]))
        except (OSError, KeyError, TypeError) as exc:
            raise ValueError(f"torn journal {path.name}: {exc!r}") from None


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary name, fsync, and rename into place: ``path`` is old or new, never torn."""
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


def write_receipt(cache: CacheDir, receipt: Receipt) -> None:
    atomic_write(cache.receipt_path(receipt.digest), receipt.to_json().encode())


def complete_entry(entry: Path) -> bool:
    """A Triton entry with a readable group file whose children all exist, or a module dir (its ``.so`` files and
    the record of the source they were built from)."""
    if not entry.is_dir():
        return False
    groups = list(entry.glob("__grp__*.json"))
    if not groups:
        files = [p for p in entry.iterdir() if p.is_file()]
        built = [p for p in files if p.suffix == ".so"]
        return bool(built) and all(p in built or p.name.endswith(SOURCE_SUFFIX) for p in files)
    try:
        return all(
            os.path.exists(p)
            for group in groups
            for p in json.loads(group.read_text())["child_paths"].values()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def publish_entries(root: Path, staging: Path, entries: list[str] | tuple[str, ...],
                    moved: list[tuple[Path, Path]]) -> tuple[int, int]:
    """Move each staged entry into ``root``; (written, already present). Whole-directory moves are
    appended to ``moved`` so a failing install can move them back."""
    written = present = 0
    for rel in entries:
        source, target = staging / rel, root / rel
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
        if complete_entry(target):
            present += 1
        else:
            _merge_into(source, target)
            written += 1
    return written, present


def _merge_into(source: Path, target: Path) -> None:
    """Fill a partial entry file by file, the group file last, each with an atomic replace."""
    files = sorted(source.iterdir(), key=lambda p: (p.name.startswith("__grp__"), p.name))
    for path in files:
        os.replace(path, target / path.name)


def recover(cache_dir: Path | CacheDir, locked: bool = False) -> int:
    """Finish publishes a killed install left behind; drop staging dirs and temp files no journal needs.

    Returns how many journals were rolled forward. Takes the lock unless the caller holds it."""
    cache = cache_dir if isinstance(cache_dir, CacheDir) else CacheDir(Path(cache_dir))
    if not (cache.state / "journal").is_dir():
        return 0
    if not locked and not leftovers(cache):  # nothing to finish: no lock (and no import of filelock) to take
        return 0
    if not locked:
        try:
            with cache.locked():
                return recover(cache, locked=True)
        except OSError as exc:
            raise StorageError(f"cannot finish an interrupted install in {cache.root}: {exc.strerror or exc}") from None
    finished = sum(roll_forward(cache, journal) for journal in cache.pending_journals())
    sweep(cache)
    return finished


def roll_forward(cache: CacheDir, path: Path) -> int:
    """Publish what one journal's staging dir still holds, then its receipt; 1 if it was one of ours."""
    try:
        journal = Journal.read(path)
    except ValueError:
        path.unlink(missing_ok=True)  # torn before its rename: nothing was published under it
        return 0
    publish_entries(cache.root, cache.state / "staging" / journal.staging, journal.entries, [])
    if all(complete_entry(cache.root / rel) for rel in journal.entries):
        write_receipt(cache, journal.receipt)
    path.unlink()
    return 1


def leftovers(cache: CacheDir) -> bool:
    """Whether a killed or running install left anything here (layout.py's ``unfinished``)."""
    return unfinished(str(cache.state))


def sweep(cache: CacheDir) -> None:
    """Remove staging dirs and temporary files; only the lock holder calls this."""
    staging = cache.state / "staging"
    for stale in sorted(staging.iterdir()) if staging.is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)
    for sub, _ in SWEPT:
        for temp in (cache.state / sub).glob(".*"):
            temp.unlink(missing_ok=True)
