"""The bundle file: a deterministic ``.tar.zst`` whose first member is ``manifest.json``.

Writing: members sorted by path, fixed mtime (SOURCE_DATE_EPOCH or 0), uid/gid 0, no owner names,
mode 0644, regular files only, one zstd frame at a fixed level with a window as long as the tar (at most
128 MiB), published with ``os.replace``.
The same inputs give byte-identical bundles. A writer given ``Frames`` (the build cache's, buildcache/frames.py)
takes the frame of a tar stream it compressed before instead of compressing it again.

Reading is a single streaming pass that trusts nothing:

* the file must be exactly one complete zstd frame: nothing after it, not cut short, its content
  checksum right, its end found from its block headers before decoding; each decoding step is
  capped by the buffer it fills, so no single step expands far (bombs);
* the decompressed stream is capped, first at the manifest size limit, then, once the manifest is
  read, at what a tar of exactly the manifest's members can take (``tar_bound``);
* the manifest must come first; every name it lists is a plain relative path, listed once, never
  both a file and a directory; sizes and counts are within ``Limits``;
* every following member must be a regular file (no links, devices, fifos, directories, sparse
  files) with a plain name, listed in the manifest, of the size it says, seen once, and streamed to
  its destination while its sha256 is checked.

Any violation raises a ``BundleError`` subclass with its own exit code. ``extract`` writes only
inside the fresh directory it is given, and the caller discards it on error.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import zstandard

from ..errors import (
    BundleError,
    BundleFormatError,
    BundleManifestError,
    IntegrityError,
    LimitExceededError,
    StorageError,
    UnsafeMemberError,
    UsageError,
)
from .manifest import MANIFEST_NAME, FileRecord, Manifest
from .overlap import ReadAhead, Writer, new_file

# Level 12 with a window as long as the tar stream (up to 128 MiB): a bundle holds many near-copies of one kernel
# (one per vocab size, dtype or batch class) far apart in the stream, which a long window finds. On the default
# recipe's 92 MiB stream that is 7.2 MiB in 1.7 s, against 10.5 MiB in 30-60 s at level 19's 8 MiB window.
ZSTD_LEVEL = 12
MAX_WINDOW_LOG = 27  # what zstd's decoders accept without being told (ZSTD_WINDOWLOG_LIMIT_DEFAULT): 128 MiB
MIN_WINDOW_LOG = 10
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CHUNK = 1 << 20
READAHEAD = 64 << 10  # decompressed bytes buffered ahead of the tar reader
FEED = 128 << 10  # compressed bytes read at a time (the output of each step is capped by its buffer)
MAX_FRAME_HEADER = 18  # magic, descriptor, window, dictionary id, content size (RFC 8878)
BLOCK = tarfile.BLOCKSIZE
HEADER_ALLOWANCE = 4 * BLOCK  # a member's header plus a PAX header for a long name
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
            var = f"KERNELCACHE_MAX_{name.upper()}"
            value = overrides.get(name)
            if value is None and os.environ.get(var):
                value = _env_size(var)
            values[name] = default if value is None else value
            if values[name] < 1:
                raise UsageError(f"a limit of {values[name]} {name.replace('_', ' ')} would refuse every bundle "
                                 f"(--max-* / {var} must be at least 1)")
        return cls(**values)


def _env_size(var: str) -> int:
    try:
        return parse_size(os.environ[var])
    except UsageError as exc:
        raise UsageError(f"{var}: {exc}") from None


def parse_size(text: str) -> int:
    """``"512M"``, ``"2G"``, ``"65536"`` -> bytes (binary units: K = 1024)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(i?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise UsageError(f"not a size: {text!r} (expected e.g. 65536, 512M or 2G)")
    return int(match.group(1)) << (10 * " KMGT".index(match.group(2).upper() or " "))


def source_date_epoch() -> int:
    text = os.environ.get("SOURCE_DATE_EPOCH", "0").strip() or "0"
    if not text.isdigit():
        raise UsageError(f"SOURCE_DATE_EPOCH must be a non-negative integer (seconds), got {text!r}")
    return int(text)


def check_member_name(name: str) -> None:
    """Plain relative paths of at most MAX_DEPTH safe components; nothing else gets in."""
    parts = name.split("/")
    if name.startswith("/") or len(parts) > MAX_DEPTH or not all(_SAFE_PART.fullmatch(p) for p in parts):
        raise UnsafeMemberError(f"unsafe member name {name!r}")
    if any(p in (".", "..") for p in parts):
        raise UnsafeMemberError(f"unsafe member name {name!r}")


# -- writing -------------------------------------------------------------------------------------


class Frames(Protocol):
    """Where compressed bundles are kept by ``frame_key`` (buildcache/frames.py): ``get`` gives the first kept frame
    that ``accept`` takes, or None."""

    def get(self, key: str, accept: Callable[[bytes], bool]) -> bytes | None: ...

    def put(self, key: str, frame: bytes) -> None: ...


def write(path: str | os.PathLike, manifest: Manifest, members: Iterable[tuple[str, Callable[[], bytes]]],
          level: int = ZSTD_LEVEL, frames: Frames | None = None) -> Path:
    """Write a bundle atomically. ``members`` yields (path, read) pairs; they are sorted here. ``frames``: compressed
    bundles kept by their tar stream, level and zstandard (a rebuild of the same members compresses nothing)."""
    out = Path(path)
    stream = tar_stream(manifest, members)
    tmp = out.with_name(f".{out.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as raw:
            raw.write(compressed(stream, level, frames))
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        discard(tmp)
        raise StorageError(f"cannot write {out}: {exc.strerror or exc}") from None
    except BaseException:
        discard(tmp)
        raise
    return out


def tar_stream(manifest: Manifest, members: Iterable[tuple[str, Callable[[], bytes]]]) -> bytes:
    """The bundle's uncompressed tar: ``manifest.json`` first, then the members by path, with fixed headers."""
    mtime = manifest.build.source_date_epoch
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST_NAME, manifest.to_json(), mtime)
        for name, read in sorted(members, key=lambda m: m[0]):
            check_member_name(name)
            _add(tar, name, read(), mtime)
    return stream.getvalue()


def compressed(stream: bytes, level: int, frames: Frames | None = None) -> bytes:
    """One zstd frame of ``stream`` (content checksum on, no content size: the streaming form), taken from
    ``frames`` when it holds one that decompresses to ``stream``, else compressed and put there."""
    key = frame_key(stream, level)
    kept = frames.get(key, lambda frame: _holds(frame, stream)) if frames is not None else None
    if kept is not None:
        return kept
    out = io.BytesIO()
    params = zstandard.ZstdCompressionParameters.from_level(level, window_log=window_log(len(stream)),
                                                            write_checksum=True)
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(out, closefd=False) as zst:
        zst.write(stream)
    frame = out.getvalue()
    if frames is not None:
        frames.put(key, frame)
    return frame


def window_log(size: int) -> int:
    """The window that covers a stream of ``size`` bytes, within what every decoder accepts by default."""
    return max(MIN_WINDOW_LOG, min(MAX_WINDOW_LOG, (size - 1).bit_length()))


def frame_key(stream: bytes, level: int) -> str:
    """What decides a bundle's compressed bytes: the tar stream's sha256 (its size gives the window), the level,
    zstandard and its libzstd."""
    inputs = f"kernelcache bundle frame 2\0{hashlib.sha256(stream).hexdigest()}\0{level}\0{zstandard.__version__}" \
             f"\0{zstandard.ZSTD_VERSION}"
    return hashlib.sha256(inputs.encode()).hexdigest()


def _holds(frame: bytes, stream: bytes) -> bool:
    """Whether ``frame`` is exactly one zstd frame (nothing after it, as the reader demands) that decompresses to
    exactly ``stream`` (decoding stops past ``stream``'s size: a kept frame is not trusted to be small)."""
    try:
        if frame_end(io.BytesIO(frame), "a kept frame") != len(frame):
            return False
        data = zstandard.ZstdDecompressor().decompress(frame, max_output_size=len(stream))
    except (BundleFormatError, zstandard.ZstdError):
        return False
    return data == stream


def discard(path: Path) -> None:
    """Best-effort cleanup of a temp file (one under a path that is not a directory never existed)."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


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


class _Frame(io.RawIOBase):
    """Exactly one complete zstd frame, decompressed under a byte cap.

    The frame's extent is checked before anything is decompressed (``frame_end``): input that runs out
    inside the frame is a truncated bundle, and bytes after it are refused. Each read asks libzstd for at
    most the bytes its buffer holds, so no step expands far however extreme the ratio (zstd bombs);
    ``limit`` caps the total and can be tightened once the manifest says how much is coming; libzstd
    checks the frame's content checksum when it reaches the end.
    """

    def __init__(self, raw, limit: int, name: str):
        self.raw, self.limit, self.name, self.seen = raw, limit, name, 0
        end, size = frame_end(raw, name), os.fstat(raw.fileno()).st_size
        if size < end:
            raise BundleFormatError(f"{name} is truncated: the zstd frame ends early")
        if size > end:
            raise BundleFormatError(f"{name} has data after the end of its zstd frame")
        raw.seek(0)
        self.zstd = zstandard.ZstdDecompressor().stream_reader(raw, read_size=FEED, closefd=False)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")[:self.limit - self.seen + 1]
        try:
            count = self.zstd.readinto(view)
        except zstandard.ZstdError as exc:
            raise BundleFormatError(f"{self.name}: corrupt zstd stream: {exc}") from None
        self.seen += count
        if self.seen > self.limit:
            raise LimitExceededError(f"{self.name} expands past {self.limit} bytes, more than its manifest allows")
        return count


def frame_end(raw, name: str) -> int:
    """The offset just past the zstd frame at the start of ``raw``, from its header and block headers alone
    (RFC 8878 section 3.1.1: each block header gives its type and size; the frame's last block says so;
    a 4-byte content checksum follows when the frame header announces one). Python-zstandard's streaming
    reader does not say where a frame ended, and this is how trailing data is told from a frame."""
    raw.seek(0)
    head = raw.read(MAX_FRAME_HEADER)
    try:
        offset = zstandard.frame_header_size(head)
    except zstandard.ZstdError as exc:
        raise BundleFormatError(f"{name}: corrupt zstd frame header: {exc}") from None
    while True:
        raw.seek(offset)
        block = raw.read(3)
        if len(block) < 3:
            raise BundleFormatError(f"{name} is truncated: the zstd frame ends early")
        header = int.from_bytes(block, "little")
        kind, size = (header >> 1) & 3, header >> 3
        if kind == 3:
            raise BundleFormatError(f"{name}: corrupt zstd stream: reserved block type")
        offset += 3 + (1 if kind == 1 else size)  # an RLE block holds one byte
        if header & 1:
            return offset + (4 if head[4] & 4 else 0)


def tar_bound(manifest: Manifest, manifest_size: int) -> int:
    """The most bytes a well-formed tar of this manifest can take (headers, padding, long names)."""
    def padded(size: int) -> int:
        return -(-size // BLOCK) * BLOCK

    members = sum(padded(f.size) + HEADER_ALLOWANCE for f in manifest.files())
    return HEADER_ALLOWANCE + padded(manifest_size) + members + tarfile.RECORDSIZE + 2 * BLOCK


def read_manifest(path: str | os.PathLike, limits: Limits | None = None) -> Manifest:
    """Only the manifest (the first member): enough for inspect, diff and planning an install."""
    return read_manifest_member(path, limits)[0]


def read_manifest_member(path: str | os.PathLike, limits: Limits | None = None) -> tuple[Manifest, bytes]:
    """The manifest and its member's bytes as the bundle holds them (for ``bundle_digest``'s shortcut)."""
    with _open_tar(path, limits or Limits.from_env()) as reader:
        manifest = reader.manifest()
        return manifest, reader.manifest_bytes


def bundle_digest(manifest: Manifest, member: bytes | None = None, known: Callable[[str], bool] | None = None) -> str:
    """The bundle's identity: the sha256 of its manifest, which pins every member's sha256.

    The manifest is hashed in its canonical form (``Manifest.to_json``), 50-100 ms of serializing for a
    sampler bundle. Given the manifest.json ``member`` as read and ``known`` (is this a digest seen
    before, e.g. an install receipt), a member whose own sha256 is known is that digest without
    serializing: only a manifest's canonical bytes hash to its digest, so that member is canonical."""
    if member is not None and known is not None:
        quick = hashlib.sha256(member).hexdigest()
        if known(quick):
            return quick
    return hashlib.sha256(manifest.to_json()).hexdigest()


def iter_members(path: str | os.PathLike, limits: Limits | None = None) -> Iterator[tuple[Manifest, str, bytes]]:
    """Yield (manifest, member path, verified bytes) for every member, checking everything."""
    with _open_tar(path, limits or Limits.from_env()) as reader:
        manifest = reader.manifest()
        for info, record in reader.members():
            yield manifest, info.name, reader.read_verified(info, record)
        reader.finish()


def extract(path: str | os.PathLike, dest: str | os.PathLike, limits: Limits | None = None,
            rewrite: Mapping[str, Callable[[bytes], bytes]] | None = None) -> Manifest:
    """Verify and write every member under ``dest`` (a fresh staging dir). Returns the manifest.

    A member is checked against its sha256 before it is written (one larger than ``CHUNK`` is streamed to
    its file while it is hashed); if its sha256 is wrong, or anything later in the bundle is, this raises
    and the caller discards ``dest`` (nothing outside it is touched). ``rewrite`` maps a member's path to
    what its verified bytes become on disk (the installer points group files at their final paths while
    they are in memory, instead of reading them back)."""
    root, rewrite, writer = os.fspath(dest), rewrite or {}, Writer()
    try:
        with _open_tar(path, limits or Limits.from_env(), ahead=True) as reader:
            manifest = reader.manifest()
            unknown = sorted(set(rewrite) - set(reader.expected))
            if unknown:
                raise IntegrityError(f"member {unknown[0]!r} is not listed in the manifest")
            for info, record in reader.members():
                target = os.path.join(root, *info.name.split("/"))  # os.path: pathlib costs 30 ms on 1,100 files
                if info.size <= CHUNK or info.name in rewrite:
                    data = reader.read_verified(info, record)
                    writer.write(target, rewrite[info.name](data) if info.name in rewrite else data)
                else:
                    _stream_to(reader, info, record, target)
            reader.finish()
        writer.close()
    finally:
        writer.abandon()  # after an error: nothing is still being written when the caller removes dest
    return manifest


def _stream_to(reader: _open_tar, info: tarfile.TarInfo, record: FileRecord, target: str) -> None:
    """A member larger than ``CHUNK``, hashed while it is written (never whole in memory)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with os.fdopen(new_file(target), "wb") as handle:
        reader.copy_verified(info, record, handle)


_CHAINED = "corrupt tar stream: extension headers chained too deep to read"


def _check_sha256(info: tarfile.TarInfo, record: FileRecord, digest: str) -> None:
    if digest != record.sha256:
        raise IntegrityError(f"member {info.name!r} does not match its sha256 in the manifest")


class _Forward:
    """The decompressed stream as tarfile reads it: ``read``, ``tell``, and ``seek`` ahead only, by reading (what
    tarfile's own ``_Stream`` gives ``open(mode="r|")``, without its reads of 10 KiB joined and sliced in Python:
    ~40 ms of an install of 90 MB). A member's bytes come in one read of the ``BufferedReader`` below."""

    def __init__(self, stream: io.BufferedReader):
        self.stream, self.pos = stream, 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.pos += len(data)
        return data

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            pos += self.pos
        if whence not in (io.SEEK_SET, io.SEEK_CUR) or pos < self.pos:
            raise tarfile.StreamError("seeking backwards is not allowed")
        while self.pos < pos and self.read(min(pos - self.pos, CHUNK)):
            pass
        return self.pos


class _open_tar:
    """One pass over a bundle: the manifest, then members in order, then the end of the frame."""

    def __init__(self, path, limits: Limits, ahead: bool = False):
        self.path, self.limits, self.ahead = Path(path), limits, ahead
        self.read_ahead: ReadAhead | None = None
        self.expected: dict[str, FileRecord] = {}
        self.seen: set[str] = set()

    def __enter__(self) -> _open_tar:
        try:
            self.raw = open(self.path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:  # the caller named no bundle
            raise UsageError(f"no bundle at {self.path}: {exc.strerror}") from None
        except OSError as exc:
            raise BundleFormatError(f"cannot open bundle {self.path}: {exc.strerror or exc}") from None
        try:
            if self.raw.read(4) != ZSTD_MAGIC:
                raise BundleFormatError(f"{self.path} is not a zstd-compressed bundle")
            self.raw.seek(0)
            first = self.limits.manifest_bytes + HEADER_ALLOWANCE + 2 * READAHEAD + tarfile.RECORDSIZE
            self.frame = _Frame(self.raw, first, self.path.name)
            if self.ahead:  # started once the manifest is read and the cap tightened
                self.read_ahead = ReadAhead(self.frame)
            self.stream = _Forward(io.BufferedReader(self.read_ahead or self.frame, buffer_size=READAHEAD))
            try:
                self.tar = tarfile.TarFile(fileobj=self.stream, mode="r")  # what open(mode="r|") makes, on _Forward
            except (tarfile.TarError, EOFError) as exc:
                raise BundleFormatError(f"{self.path} is not a tar stream: {exc}") from None
            except RecursionError:
                raise BundleFormatError(f"{self.path}: {_CHAINED}") from None
        except BaseException:
            self.raw.close()
            raise
        return self

    def __exit__(self, *exc_info):
        if self.read_ahead is not None:
            self.read_ahead.close()  # its thread reads self.raw: stopped first
        self.raw.close()
        return False

    def manifest(self) -> Manifest:
        first = self._next()
        if first is None or first.name != MANIFEST_NAME:
            raise BundleManifestError("manifest.json is not the first member of the bundle")
        if not _plain_file(first):
            raise UnsafeMemberError("manifest.json is not a regular file")
        if first.size > self.limits.manifest_bytes:
            raise LimitExceededError(
                f"manifest.json is {first.size} bytes, over the {self.limits.manifest_bytes} byte limit")
        self.manifest_bytes = self._read(first)
        manifest = checked_manifest(self.manifest_bytes, self.limits)
        self.expected = manifest.file_map()
        self.frame.limit = tar_bound(manifest, first.size)
        if self.read_ahead is not None:
            self.read_ahead.start()
        return manifest

    def members(self) -> Iterator[tuple[tarfile.TarInfo, FileRecord]]:
        while (info := self._next()) is not None:
            yield info, self._admit(info)
        missing = sorted(set(self.expected) - self.seen)
        if missing:
            raise IntegrityError(f"{len(missing)} member(s) listed in the manifest are missing, e.g. {missing[0]}")

    def finish(self) -> None:
        """Read to the end of the frame, so truncation, trailing data and the checksum are checked."""
        while self.stream.read(CHUNK):
            pass

    def read_verified(self, info: tarfile.TarInfo, record: FileRecord) -> bytes:
        """A member's bytes, whole (one read: for members up to ``CHUNK`` and the manifest)."""
        if self.stream.pos == info.offset_data:  # where its bytes start: read there, as extractfile would
            data = self._chunk(self.stream, info, info.size)
            if len(data) != info.size:  # what extractfile's reader raises
                raise BundleFormatError(f"truncated or corrupt tar stream in {info.name!r}: unexpected end of data")
        else:
            data = self._chunk(self.tar.extractfile(info), info, -1)
            if len(data) != info.size:
                raise BundleFormatError(f"truncated member {info.name!r}")
        _check_sha256(info, record, hashlib.sha256(data).hexdigest())
        return data

    def copy_verified(self, info: tarfile.TarInfo, record: FileRecord, out) -> None:
        _check_sha256(info, record, self._copy(info, out))

    def _copy(self, info: tarfile.TarInfo, out) -> str:
        """Stream one member's bytes to ``out``; return their sha256."""
        digest, copied = hashlib.sha256(), 0
        handle = self.tar.extractfile(info)
        while chunk := self._chunk(handle, info):
            digest.update(chunk)
            out.write(chunk)
            copied += len(chunk)
        if copied != info.size:
            raise BundleFormatError(f"truncated member {info.name!r}")
        return digest.hexdigest()

    @staticmethod
    def _chunk(handle, info: tarfile.TarInfo, size: int = CHUNK) -> bytes:
        try:
            return handle.read(size)
        except BundleError:
            raise
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise BundleFormatError(f"truncated or corrupt tar stream in {info.name!r}: {exc}") from None

    def _next(self) -> tarfile.TarInfo | None:
        try:
            return self.tar.next()
        except (tarfile.TarError, EOFError) as exc:
            raise BundleFormatError(f"truncated or corrupt tar stream: {exc}") from None
        except RecursionError:  # tarfile reads each pax / GNU long-name header by recursing into the next
            raise BundleFormatError(_CHAINED) from None

    def _read(self, info: tarfile.TarInfo) -> bytes:
        buffer = io.BytesIO()
        self._copy(info, buffer)  # the manifest has no sha256 of its own: the bundle digest is its hash
        return buffer.getvalue()

    def _admit(self, info: tarfile.TarInfo) -> FileRecord:
        check_member_name(info.name)
        if not _plain_file(info):
            raise UnsafeMemberError(
                f"member {info.name!r} is not a regular file ({_kind(info)}; links, devices and fifos are refused)")
        if info.name in self.seen or info.name == MANIFEST_NAME:
            raise UnsafeMemberError(f"member {info.name!r} appears twice")
        record = self.expected.get(info.name)
        if record is None:
            raise IntegrityError(f"member {info.name!r} is not listed in the manifest")
        if info.size != record.size:
            raise IntegrityError(f"member {info.name!r} is {info.size} bytes, the manifest says {record.size}")
        self.seen.add(info.name)
        return record


@functools.lru_cache(maxsize=2)
def checked_manifest(data: bytes, limits: Limits) -> Manifest:
    """The manifest these bytes hold, checked against ``limits``. Kept for the next read of the same bytes
    (an install reads the manifest to plan, then again as it extracts: 20-30 ms for a sampler bundle's);
    a ``Manifest`` is frozen, and bytes that fail are never kept."""
    manifest = Manifest.from_json(data)
    check_manifest(manifest, limits)
    return manifest


def check_manifest(manifest: Manifest, limits: Limits) -> None:
    """Member names, layout and sizes a manifest may declare, before any member is read."""
    records = list(manifest.files())
    if len(records) + 1 > limits.members:
        raise LimitExceededError(f"bundle lists {len(records)} members, over the limit of {limits.members}")
    paths = [r.path for r in records]
    for path in paths:
        check_member_name(path)
    if len(set(paths)) != len(paths):
        twice = sorted(p for p in set(paths) if paths.count(p) > 1)[0]
        raise BundleManifestError(f"manifest.json lists {twice!r} twice")
    parents = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    clash = sorted((set(paths) & parents) | {p for p in paths if "/" not in p})
    if clash:
        raise BundleManifestError(f"manifest.json lists {clash[0]!r} as a file where a directory must be")
    for record in records:
        if record.size > limits.member_bytes:
            raise LimitExceededError(
                f"{record.path} is {record.size} bytes, over the {limits.member_bytes} byte member limit")
    if manifest.total_size > limits.total_bytes:
        raise LimitExceededError(
            f"bundle holds {manifest.total_size} bytes, over the {limits.total_bytes} byte limit")


def _plain_file(info: tarfile.TarInfo) -> bool:
    return info.type == tarfile.REGTYPE and info.sparse is None


def _kind(info: tarfile.TarInfo) -> str:
    kinds = {tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "character device",
             tarfile.BLKTYPE: "block device", tarfile.FIFOTYPE: "fifo", tarfile.DIRTYPE: "directory"}
    if info.sparse is not None:
        return "sparse file"
    return kinds.get(info.type, f"tar type {info.type!r}")
