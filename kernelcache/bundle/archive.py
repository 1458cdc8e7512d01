"""The bundle file: a deterministic ``.tar.zst`` whose first member is ``manifest.json``.

Writing: members sorted by path, fixed mtime (SOURCE_DATE_EPOCH or 0), uid/gid 0, no owner names,
mode 0644, regular files only, one zstd frame at a fixed level, published with ``os.replace``.
The same inputs give byte-identical bundles.

Reading is a single streaming pass that trusts nothing: the manifest must come first; every
following member must be a regular file with a plain relative name, listed in the manifest, of
the size the manifest says, with the sha256 it says, seen once; the decompressed total, each
member and the member count are capped (``Limits``). Any violation raises a ``BundleError``
subclass with its own exit code before anything is handed to the caller as trusted.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard

from ..errors import (
    BundleFormatError,
    BundleManifestError,
    IntegrityError,
    LimitExceededError,
    StorageError,
    UnsafeMemberError,
)
from .manifest import MANIFEST_NAME, Manifest

ZSTD_LEVEL = 19
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CHUNK = 1 << 20
_SAFE_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}")
MAX_DEPTH = 4


@dataclass(frozen=True)
class Limits:
    """Caps on what a bundle may expand to. Override with KERNELCACHE_MAX_* variables or flags."""

    total_bytes: int = 8 << 30
    member_bytes: int = 2 << 30
    members: int = 200_000
    manifest_bytes: int = 64 << 20

    @classmethod
    def from_env(cls, **overrides: int | None) -> Limits:
        values = {}
        for name, default in (("total_bytes", cls.total_bytes), ("member_bytes", cls.member_bytes),
                              ("members", cls.members), ("manifest_bytes", cls.manifest_bytes)):
            env = os.environ.get(f"KERNELCACHE_MAX_{name.upper()}")
            values[name] = overrides.get(name) or (int(env) if env else default)
        return cls(**values)


def source_date_epoch() -> int:
    try:
        return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    except ValueError:
        return 0


def check_member_name(name: str) -> None:
    """Plain relative paths of at most MAX_DEPTH safe components; nothing else gets in."""
    parts = name.split("/")
    if name.startswith("/") or len(parts) > MAX_DEPTH or not all(_SAFE_PART.fullmatch(p) for p in parts):
        raise UnsafeMemberError(f"unsafe member name {name!r}")
    if any(p in (".", "..") for p in parts):
        raise UnsafeMemberError(f"unsafe member name {name!r}")


# -- writing -------------------------------------------------------------------------------------


def write(path: str | os.PathLike, manifest: Manifest, members: Iterable[tuple[str, Callable[[], bytes]]],
          level: int = ZSTD_LEVEL) -> Path:
    """Write a bundle atomically. ``members`` yields (path, read) pairs; they are sorted here."""
    out = Path(path)
    body = manifest.to_json()
    mtime = manifest.build.source_date_epoch
    tmp = out.with_name(f".{out.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as raw:
            compressor = zstandard.ZstdCompressor(level=level, write_checksum=True)
            with compressor.stream_writer(raw, closefd=False) as zst, \
                    tarfile.open(fileobj=zst, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                _add(tar, MANIFEST_NAME, body, mtime)
                for name, read in sorted(members, key=lambda m: m[0]):
                    check_member_name(name)
                    _add(tar, name, read(), mtime)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"cannot write {out}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = mtime
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    tar.addfile(info, io.BytesIO(data))


# -- reading -------------------------------------------------------------------------------------


class _Capped(io.RawIOBase):
    """A decompressed stream that refuses to expand past ``limit`` bytes (zstd bombs)."""

    def __init__(self, stream, limit: int):
        self.stream, self.limit, self.seen = stream, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self.stream.read(len(buffer))
        except zstandard.ZstdError as exc:
            raise BundleFormatError(f"corrupt zstd stream: {exc}") from None
        self.seen += len(data)
        if self.seen > self.limit:
            raise LimitExceededError(f"bundle expands past the {self.limit} byte limit")
        buffer[: len(data)] = data
        return len(data)


def read_manifest(path: str | os.PathLike, limits: Limits | None = None) -> Manifest:
    """Only the manifest (the first member): enough for inspect, diff and planning an install."""
    with _open_tar(path, limits or Limits.from_env()) as (tar, lim):
        return _first_manifest(tar, lim)


def bundle_digest(manifest: Manifest) -> str:
    """The bundle's identity: the sha256 of its manifest, which pins every member's sha256."""
    return hashlib.sha256(manifest.to_json()).hexdigest()


def iter_members(path: str | os.PathLike, limits: Limits | None = None) -> Iterator[tuple[Manifest, str, bytes]]:
    """Yield (manifest, member path, verified bytes) for every member, checking everything."""
    lim = limits or Limits.from_env()
    with _open_tar(path, lim) as (tar, lim):
        manifest = _first_manifest(tar, lim)
        expected = manifest.file_map()
        if len(expected) + 1 > lim.members:
            raise LimitExceededError(f"bundle lists {len(expected)} members, over the limit of {lim.members}")
        seen: set[str] = set()
        for info in _members(tar):
            record = _admit(info, expected, seen, lim)
            data = _read_verified(tar, info, record)
            yield manifest, info.name, data
        missing = sorted(set(expected) - seen)
        if missing:
            raise IntegrityError(f"{len(missing)} member(s) listed in the manifest are missing, e.g. {missing[0]}")


def extract(path: str | os.PathLike, dest: str | os.PathLike, limits: Limits | None = None) -> Manifest:
    """Verify and write every member under ``dest`` (a fresh staging dir). Returns the manifest."""
    root = Path(dest)
    manifest = None
    for current, name, data in iter_members(path, limits):
        manifest = current
        target = root.joinpath(*name.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    if manifest is None:
        manifest = read_manifest(path, limits)
    return manifest


class _open_tar:
    def __init__(self, path, limits: Limits):
        self.path, self.limits = Path(path), limits

    def __enter__(self):
        try:
            self.raw = open(self.path, "rb")
        except OSError as exc:
            raise BundleFormatError(f"cannot open bundle {self.path}: {exc.strerror or exc}") from None
        if self.raw.read(4) != ZSTD_MAGIC:
            self.raw.close()
            raise BundleFormatError(f"{self.path} is not a zstd-compressed bundle")
        self.raw.seek(0)
        reader = zstandard.ZstdDecompressor().stream_reader(self.raw, read_across_frames=True)
        stream = io.BufferedReader(_Capped(reader, self.limits.total_bytes), buffer_size=CHUNK)
        try:
            self.tar = tarfile.open(fileobj=stream, mode="r|")
        except (tarfile.TarError, EOFError) as exc:
            self.raw.close()
            raise BundleFormatError(f"{self.path} is not a tar stream: {exc}") from None
        return self.tar, self.limits

    def __exit__(self, *exc_info):
        self.raw.close()
        return False


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    while True:
        try:
            info = tar.next()
        except (tarfile.TarError, EOFError) as exc:
            raise BundleFormatError(f"truncated or corrupt tar stream: {exc}") from None
        if info is None:
            return
        yield info


def _first_manifest(tar: tarfile.TarFile, lim: Limits) -> Manifest:
    first = next(_members(tar), None)
    if first is None or first.name != MANIFEST_NAME:
        raise BundleManifestError("manifest.json is not the first member of the bundle")
    if not first.isreg():
        raise UnsafeMemberError("manifest.json is not a regular file")
    if first.size > lim.manifest_bytes:
        raise LimitExceededError(f"manifest.json is {first.size} bytes, over the {lim.manifest_bytes} byte limit")
    manifest = Manifest.from_json(_read(tar, first))
    for record in manifest.files():
        check_member_name(record.path)
        if record.size > lim.member_bytes:
            raise LimitExceededError(f"{record.path} is {record.size} bytes, over the member limit")
    if manifest.total_size > lim.total_bytes:
        raise LimitExceededError(f"bundle holds {manifest.total_size} bytes, over the {lim.total_bytes} byte limit")
    return manifest


def _admit(info: tarfile.TarInfo, expected: dict, seen: set[str], lim: Limits):
    check_member_name(info.name)
    if not info.isreg():
        raise UnsafeMemberError(f"member {info.name!r} is not a regular file (links and devices are refused)")
    if info.name in seen or info.name == MANIFEST_NAME:
        raise UnsafeMemberError(f"member {info.name!r} appears twice")
    record = expected.get(info.name)
    if record is None:
        raise IntegrityError(f"member {info.name!r} is not listed in the manifest")
    if info.size != record.size:
        raise IntegrityError(f"member {info.name!r} is {info.size} bytes, the manifest says {record.size}")
    if info.size > lim.member_bytes:
        raise LimitExceededError(f"member {info.name!r} is over the {lim.member_bytes} byte member limit")
    seen.add(info.name)
    if len(seen) + 1 > lim.members:
        raise LimitExceededError(f"bundle has more than {lim.members} members")
    return record


def _read(tar: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    handle = tar.extractfile(info)
    try:
        data = handle.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleFormatError(f"truncated or corrupt tar stream in {info.name!r}: {exc}") from None
    if len(data) != info.size:
        raise BundleFormatError(f"truncated member {info.name!r}")
    return data


def _read_verified(tar: tarfile.TarFile, info: tarfile.TarInfo, record) -> bytes:
    data = _read(tar, info)
    if hashlib.sha256(data).hexdigest() != record.sha256:
        raise IntegrityError(f"member {info.name!r} does not match its sha256 in the manifest")
    return data
