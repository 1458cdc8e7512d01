"""Compressed bundles in the build cache: a rebuild whose bundle is the same tar stream compresses nothing.

Compressing a bundle is most of what a warm build has left to do once its kernels and exercise records come from
the build cache (seconds for a large bundle). The compressed bytes are decided by
the tar stream, the level and zstandard with its libzstd (``format/archive.py`` ``frame_key``), so a frame kept
under that key is the frame the compressor would write. It is kept as a build-cache entry of kind ``bundle``
(one file, checked against its sha256 like every entry), and a frame is taken only when the archive writer's check
accepts it (exactly one frame that decompresses to its stream): a wrong or corrupt frame is compressed again.
"""

from __future__ import annotations

from collections.abc import Callable

from .blob import CorruptEntry, pack, unpack

KIND = "bundle"
FRAME = "bundle.tar.zst"


class StoreFrames:
    """``format.archive.Frames`` over a build-cache store (buildcache/store.py); a store that fails is no frame."""

    def __init__(self, store):
        self.store = store
        self.reused = 0  # bundles whose frame came from the store
        self.errors: list[str] = []  # store failures (the bundle was compressed, or not kept, instead)

    def get(self, key: str, accept: Callable[[bytes], bool]) -> bytes | None:
        """The first whole entry's frame that ``accept`` takes (the writer's check that it decodes to its stream)."""
        for blob in self._blobs(key):
            try:
                entry, files = unpack(blob, key)
            except CorruptEntry:
                continue
            if entry.kind == KIND and FRAME in files and accept(files[FRAME]):
                self.reused += 1
                return files[FRAME]
        return None

    def put(self, key: str, frame: bytes) -> None:
        entry, blob = pack(key, KIND, None, {FRAME: frame})
        try:
            self.store.put(key, entry.variant, blob)
        except Exception as exc:  # noqa: BLE001 -- the bundle is written; only the next build misses out
            self.errors.append(f"a compressed bundle was not kept: {exc}")

    def _blobs(self, key: str) -> list[bytes]:
        try:
            return self.store.get(key)
        except Exception as exc:  # noqa: BLE001 -- the store failed: compress instead, and say so
            self.errors.append(f"a compressed bundle could not be read: {exc}")
            return []
