"""Environment fingerprints computed before, kept in the cache dir they were checked for.

``<cache>/.kernelcache/fingerprints/<key digest>.json`` holds one ``KnownEnvironment``: the
fingerprint and the full ``EnvironmentKey`` it was computed under. A record is used only when its
stored key equals the key computed now, field by field (the file name is only where to look), so
an upgraded Triton, another interpreter, another ptxas or another variable always recomputes.

Records are written only into a state dir that exists (an install that is refused creates nothing)
and are not covered by the lock: each is one atomic rename, and two writers write the same bytes.
A record that cannot be read is ignored; the newest ``KEEP`` are kept.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..bundle.envkey import EnvironmentKey, KnownEnvironment
from .publish import atomic_write
from .state import CacheDir

KEEP = 16


def _folder(cache: CacheDir) -> Path:
    return cache.state / "fingerprints"


def load_fingerprint(cache: CacheDir, key: EnvironmentKey) -> KnownEnvironment | None:
    """The record computed under ``key`` in this cache dir, or None (none, unreadable, another key)."""
    try:
        known = KnownEnvironment.from_json((_folder(cache) / f"{key.digest}.json").read_bytes())
    except (OSError, ValueError):
        return None
    return known if known.key == key else None


def save_fingerprint(cache: CacheDir, known: KnownEnvironment) -> None:
    """Keep ``known`` for the next command; a cache dir that cannot take it only loses the speed-up."""
    if not cache.state.is_dir():
        return
    folder = _folder(cache)
    with contextlib.suppress(OSError):
        folder.mkdir(exist_ok=True)
        atomic_write(folder / f"{known.key.digest}.json", known.to_json().encode())
        _prune(folder)


def _prune(folder: Path) -> None:
    records = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for stale in records[KEEP:]:
        stale.unlink(missing_ok=True)
