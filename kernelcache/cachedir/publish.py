"""Publishing staged entries into a cache dir, the journal that makes it survive a kill, and recovery.

An install writes, before it publishes anything, a ``Journal``: the staging dir, the entries to
publish and the receipt to write. Publishing renames each staged entry into place -- a whole
directory in one ``rename`` where the key is new; file by file, group file last, where Triton left a
partial one; complete entries already there are left alone. A reader never sees a partial entry:
Triton trusts an entry only once its group file exists (``FileCacheManager.put_group`` in
triton/runtime/cache.py writes it last), and each new entry appears in one rename.

Removing a bundle (``withdraw``) runs the other way, under the same lock and journal: a ``Removal``
journal names the entries no other installed bundle uses; then the receipt goes (kernelcache stops
trusting the bundle), each entry is renamed whole out of the cache into staging (a reader finds it
complete or not at all, never partial) and deleted there, and the journal is dropped.

``recover`` (under the lock) rolls every journal forward: an install's publishes what its staging dir
still holds, writes the receipt once every entry is complete, and drops the journal; a removal's
finishes the removal. Then ``sweep`` removes staging dirs and temporary files no journal needs.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import StorageError
from ..format.manifest import ENGINE_FILES
from ..hooks.kernelcache_autotune import SUFFIX as AUTOTUNE_SUFFIX
from ..hooks.kernelcache_prebuilt import SOURCE_SUFFIX
from ..hooks.kernelcache_walks import BUNDLE_FILE as WALKS_FILE
from .layout import JOURNAL, SWEPT, unfinished
from .state import REMOVAL_SUFFIX, CacheDir, Receipt
from .vllm_tree import aot_entry


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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # threads of one process too
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
    """A Triton entry with a readable group file whose children all exist, a module dir (its ``.so`` files and
    the record of the source they were built from), an autotune choice (Triton writes its one file with
    ``os.replace``: one already there, the cache dir's own, is left alone), or a bundle's walk record (its dir is
    named by its digest: one there is the same), a vLLM compile record beside its tree (``vllm-compile/<sha16>``,
    named by the record's digest, which holds the tree's sha256), or a vLLM AOT directory (vllm_tree.py: placed whole
    by one rename; one already there, vLLM's own or another bundle's of the same hash, is left alone)."""
    if not entry.is_dir():
        return False
    if aot_entry(entry):
        return next(entry.iterdir(), None) is not None
    groups = list(entry.glob("__grp__*.json"))
    if not groups:
        files = [p for p in entry.iterdir() if p.is_file()]
        by_digest = sorted(p.name for p in files) in ([WALKS_FILE], sorted(ENGINE_FILES))  # one there is the same
        if by_digest or (files and all(p.name.endswith(AUTOTUNE_SUFFIX) for p in files)):
            return True
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


def recover(cache: CacheDir, locked: bool = False) -> int:
    """Finish publishes a killed install left behind; drop staging dirs and temp files no journal needs.

    Returns how many journals were rolled forward. Takes the lock unless the caller holds it."""
    if not (cache.state / JOURNAL).is_dir():
        return 0
    if not locked and not leftovers(cache):  # nothing to finish: no lock (and no import of filelock) to take
        return 0
    if not locked:
        try:
            with cache.locked():
                return recover(cache, locked=True)
        except OSError as exc:
            raise StorageError(f"cannot finish an interrupted install in {cache.root}: {exc.strerror or exc}") from None
    finished = sum(finish_removal(cache, journal) if journal.name.endswith(REMOVAL_SUFFIX)
                   else roll_forward(cache, journal) for journal in cache.pending_journals())
    sweep(cache)
    return finished


def roll_forward(cache: CacheDir, path: Path) -> int:
    """Publish what one journal's staging dir still holds, then its receipt; 1 if it was one of ours."""
    journal = _read_journal(Journal, path)
    if journal is None:
        return 0
    publish_entries(cache.root, cache.staging / journal.staging, journal.entries, [])
    if all(complete_entry(cache.root / rel) for rel in journal.entries):
        write_receipt(cache, journal.receipt)
    path.unlink()
    return 1


# -- removing a bundle -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Removal:
    """A removal's intent, written before the receipt goes: roll it forward after a kill."""

    digest: str
    entries: tuple[str, ...]  # the bundle's entries no other installed bundle used when it was planned
    trash: str  # how the entries are named once renamed into .kernelcache/staging/, to be deleted there

    def to_json(self) -> str:
        return json.dumps({"digest": self.digest, "entries": list(self.entries), "trash": self.trash})

    @classmethod
    def read(cls, path: Path) -> Removal:
        """``ValueError`` when the journal is torn or not one of ours."""
        try:
            data = json.loads(path.read_text())
            removal = cls(str(data["digest"]), tuple(map(str, data["entries"])), Path(data["trash"]).name)
        except (OSError, KeyError, TypeError) as exc:
            raise ValueError(f"torn journal {path.name}: {exc!r}") from None
        if not removal.trash.startswith("rm-"):
            raise ValueError(f"journal {path.name} names a trash name that is not a removal's")
        return removal


def withdraw(cache: CacheDir, digest: str, entries: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Remove the installed bundle ``digest`` and ``entries`` (its entries no other bundle uses), crash-safely;
    only the lock holder calls this. A kill at any point leaves the journal that ``recover`` finishes. Returns
    the entries that could not be renamed out (a mount point, a permission): left in place, whole."""
    removal = Removal(digest, tuple(entries), f"rm-{digest[:16]}-{os.getpid()}")
    path = cache.removal_path(digest)
    atomic_write(path, removal.to_json().encode())
    return _finish(cache, path, removal)


def finish_removal(cache: CacheDir, path: Path) -> int:
    """Carry out a removal journal a killed process left; 1 if it was one of ours."""
    removal = _read_journal(Removal, path)
    if removal is None:
        return 0
    _finish(cache, path, removal)
    return 1


def _read_journal(kind: type[Journal] | type[Removal], path: Path) -> Journal | Removal | None:
    """The journal at ``path``; None once a torn one is dropped (cut short before its rename, so nothing was
    published or removed under it)."""
    try:
        return kind.read(path)
    except ValueError:
        path.unlink(missing_ok=True)
        return None


def _finish(cache: CacheDir, path: Path, removal: Removal) -> tuple[str, ...]:
    """Drop the receipt, move each entry out whole and delete it, drop the journal; the entries left in place."""
    try:
        cache.receipt_path(removal.digest).unlink(missing_ok=True)
    except OSError:
        path.unlink(missing_ok=True)  # nothing was removed under it: the bundle stays installed, whole
        raise
    stuck = _move_out(cache, removal)
    _drop_empty_parents(cache.root, removal.entries)
    path.unlink()
    return stuck


def _move_out(cache: CacheDir, removal: Removal) -> tuple[str, ...]:
    """Rename each entry of ``removal`` into staging, whole, and delete it there; the ones that cannot be renamed
    stay, whole (unowned Triton entries). Entries an installed bundle lists now stay too (only a receipt that
    appeared since the journal was written, which no install can do before it recovers); with any receipt
    unreadable, every entry stays."""
    scan = cache.scan()
    used = None if scan.bad else {e for r in scan.receipts for e in r.uses}
    stuck = []
    for index, rel in enumerate(removal.entries):
        entry = cache.root / rel
        if used is None or rel in used or not _removable(rel) or not os.path.lexists(entry):
            continue
        trash = cache.staging / f"{removal.trash}-{index}-{os.getpid()}"
        try:
            os.rename(entry, trash)  # one rename: whole or gone, never partial
        except OSError:
            stuck.append(rel)
            continue
        shutil.rmtree(trash, ignore_errors=True)  # what stays is a staging leftover: the next sweep takes it
    return tuple(stuck)


def _removable(rel: str) -> bool:
    """An entry name an install could have published: a plain relative path inside the cache, outside its state."""
    from ..errors import UnsafeMemberError
    from ..format.archive import check_member_name  # only a removal pays for the archive module's imports

    try:
        check_member_name(rel)
    except UnsafeMemberError:
        return False
    return True


def _drop_empty_parents(root: Path, entries: tuple[str, ...]) -> None:
    """Remove the directories that held nested entries (FlashInfer's ``flashinfer/<dir>/<name>``) once empty."""
    parents = {parent for rel in entries for parent in Path(rel).parents if parent != Path(".")}
    for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        try:
            (root / parent).rmdir()
        except OSError:  # not empty (another bundle's module, a Triton entry) or gone
            continue


def leftovers(cache: CacheDir) -> bool:
    """Whether a killed or running install left anything here (layout.py's ``unfinished``)."""
    return unfinished(str(cache.state))


def sweep(cache: CacheDir) -> None:
    """Remove staging dirs and temporary files; only the lock holder calls this."""
    staging = cache.staging
    for stale in sorted(staging.iterdir()) if staging.is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)
    for sub, _ in SWEPT:
        for temp in (cache.state / sub).glob(".*"):
            temp.unlink(missing_ok=True)
