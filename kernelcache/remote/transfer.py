"""Land a downloaded bundle safely: temp name, hash while writing, verify, then rename.

Whatever the transport, the bytes stream into ``.<name>.part-<pid>`` beside the destination,
hashed on the way. Only when the byte count and sha256 match what the source promised (a
registry descriptor, a ``#sha256=`` pin), and the file reads as a bundle (its manifest first; with
``verify_members`` every member's sha256 too), is it renamed to its final name. Any failure or
interruption removes the partial file, so no file that looks complete is ever left behind.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import BundleError, IntegrityError, RemoteError, StorageError
from ..format import archive
from ..format.manifest import Manifest

_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}")


@dataclass(frozen=True)
class Expected:
    """What the source promised about the bytes; ``None`` means it promised nothing."""

    sha256: str | None = None  # hex, no "sha256:" prefix
    size: int | None = None
    bundle_digest: str | None = None  # sha256 of the bundle's manifest.json


@dataclass(frozen=True)
class Landed:
    path: Path
    manifest: Manifest
    sha256: str
    size: int

    @property
    def digest(self) -> str:
        return archive.bundle_digest(self.manifest)

    def to_dict(self) -> dict:
        return {"path": str(self.path), "digest": self.digest, "sha256": self.sha256, "size": self.size,
                "arch": self.manifest.target.arch, "gpu": self.manifest.target.gpu}


def safe_name(name: str | None, fallback: str) -> str:
    """A plain file name (no directories, no odd characters) for what a remote calls the bundle."""
    base = os.path.basename(name or "")
    return base if _SAFE_NAME.fullmatch(base) and base not in (".", "..") else fallback


def land(chunks: Iterable[bytes], dest: Path, expected: Expected, source: str,
         verify_members: bool = True, accept: Callable[[Manifest], None] | None = None) -> Landed:
    """Write ``chunks`` to ``dest`` atomically, or leave nothing there and raise.

    ``accept`` may refuse the verified manifest (raise) before anything takes ``dest``'s name, so a
    refused download never replaces a file the user already had there.
    """
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        sha256, size = _write(chunks, part)
        _check_bytes(sha256, size, expected, source)
        manifest = _check_bundle(part, expected, source, verify_members)
        if accept is not None:
            accept(manifest)
        os.replace(part, dest)
    except OSError as exc:
        archive.discard(part)
        raise StorageError(f"cannot write {dest}: {exc.strerror or exc}") from None
    except BaseException:
        archive.discard(part)
        raise
    return Landed(dest, manifest, sha256, size)


def _write(chunks: Iterable[bytes], part: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as handle:
        for chunk in chunks:
            digest.update(chunk)
            size += len(chunk)
            handle.write(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    return digest.hexdigest(), size


def _check_bytes(sha256: str, size: int, expected: Expected, source: str) -> None:
    if expected.size is not None and size != expected.size:
        raise RemoteError(f"{source}: got {size} bytes, expected {expected.size} (truncated or wrong content)")
    if expected.sha256 is not None and sha256 != expected.sha256:
        raise IntegrityError(f"{source}: content sha256 {sha256[:16]}… does not match the expected "
                             f"{expected.sha256[:16]}…; nothing was kept")


def verify(path: Path) -> Manifest:
    """Read every member of a bundle, checking each against the manifest; return the manifest."""
    seen = [manifest for manifest, _, _ in archive.iter_members(path)][-1:]
    return seen[0] if seen else archive.read_manifest(path)


def _check_bundle(part: Path, expected: Expected, source: str, verify_members: bool) -> Manifest:
    try:
        manifest = verify(part) if verify_members else archive.read_manifest(part)
    except BundleError as exc:
        raise type(exc)(f"{source}: {exc}") from None
    if expected.bundle_digest is not None and archive.bundle_digest(manifest) != expected.bundle_digest:
        raise IntegrityError(f"{source}: the bundle's manifest digest {archive.bundle_digest(manifest)[:16]}… is not "
                             f"the {expected.bundle_digest[:16]}… its registry manifest names")
    return manifest
