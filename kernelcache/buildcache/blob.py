"""One build-cache entry: the files Triton wrote under one cache key, packed as one zstd-compressed tar (a blob).

The tar's first member is ``entry.json`` (``Entry``): the key, what the files are (a kernel with the name of
its group, or a gcc-built helper module), each file's sha256 and size, and the absolute paths the files embed.
The other members are the files, by name. ``unpack`` gives the files back only when the blob is exactly that:
one zstd frame under a size cap, plain regular members named as the record names them, every sha256 and size
as recorded, and the key the one asked for; anything else is ``CorruptEntry``, which the build treats as a
miss (it compiles the kernel and publishes a good entry over the bad one).

Why the paths: Triton's cache key hashes a kernel's source text, not the file it lives in, yet the compiled
files hold that file's path (the cubin's and PTX's line info, the IR's locations) and the metadata holds the
path of Triton's libdevice. The same key compiled from a vLLM installed elsewhere gives other bytes, so an
entry is reused only where every path it embeds is this process's own (buildcache/manager.py), and a build
with the cache writes the bytes a build without it writes. A store keeps one entry per key and ``variant``
(the digest of those paths), so installs at different paths sharing one cache each keep their own.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass

FORMAT = 1
RECORD = "entry.json"
MAX_BYTES = 512 << 20  # a blob that expands beyond this is refused: no kernel or helper module is that large
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")
_KEY = re.compile(r"[A-Z2-7]{52}")
_QUOTED_PATH = re.compile(rb'"(/[^"\n\x00]{1,4096})"')  # IR locations, PTX .file, the metadata's libdevice
_C_STRING_PATH = re.compile(rb"\x00(/(?:[\w.+-]+/)+[\w.+-]+)\x00")  # a module's __FILE__ of a C header


class CorruptEntry(ValueError):
    """A blob that is not a complete, consistent entry for the key asked for."""


@dataclass(frozen=True)
class EntryFile:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Entry:
    """``entry.json``: what one blob holds."""

    key: str  # the Triton cache directory name (base32 of the key's sha256)
    kind: str  # "kernel": a compiled kernel and its group; "module": a gcc-built helper (launcher, cuda_utils);
    # "flashinfer": FlashInfer's sampling module and its record (buildcache/flashinfer_modules.py)
    group: str | None  # kernels: the metadata file the group file is named after (``k.json`` -> ``__grp__k.json``)
    files: tuple[EntryFile, ...]
    paths: tuple[str, ...] = ()  # absolute paths the files embed (kernel sources in line info, libdevice)

    @property
    def variant(self) -> str:
        """What tells apart entries of one key compiled from installs at other paths: a digest of ``paths``."""
        return hashlib.sha256("\n".join(self.paths).encode()).hexdigest()[:16]

    def to_json(self) -> bytes:
        data = {"format": FORMAT, "key": self.key, "kind": self.kind, "group": self.group,
                "files": [{"name": f.name, "sha256": f.sha256, "size": f.size} for f in self.files],
                "paths": list(self.paths)}
        return json.dumps(data, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Entry:
        try:
            data = json.loads(raw)
            if data.get("format") != FORMAT:
                raise CorruptEntry(f"entry format {data.get('format')!r}, not {FORMAT}")
            files = tuple(EntryFile(str(f["name"]), str(f["sha256"]), int(f["size"])) for f in data["files"])
            return cls(str(data["key"]), str(data["kind"]), data.get("group"), files,
                       tuple(str(p) for p in data.get("paths", ())))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptEntry(f"unreadable {RECORD}: {exc}") from None


def pack(key: str, kind: str, group: str | None, files: dict[str, bytes]) -> tuple[Entry, bytes]:
    """The record and blob of one entry (deterministic: the same files give the same bytes)."""
    import zstandard

    record = Entry(key, kind, group, tuple(EntryFile(n, hashlib.sha256(d).hexdigest(), len(d))
                                           for n, d in sorted(files.items())),
                   embedded_paths(files))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, RECORD, record.to_json())
        for name, data in sorted(files.items()):
            _add(tar, name, data)
    return record, zstandard.ZstdCompressor(level=3).compress(raw.getvalue())


def unpack(blob: bytes, key: str) -> tuple[Entry, dict[str, bytes]]:
    """The record and files of a blob for ``key``, every file checked against its recorded sha256 and size."""
    members = _members(_decompress(blob))
    if not members or members[0][0] != RECORD:
        raise CorruptEntry(f"the blob does not start with {RECORD}")
    entry = Entry.from_json(members[0][1])
    if entry.key != key:
        raise CorruptEntry(f"the blob holds key {entry.key}, not {key}")
    files = dict(members[1:])
    if sorted(files) != sorted(f.name for f in entry.files) or len(files) != len(members) - 1:
        raise CorruptEntry("its files are not the ones its record lists")
    for record in entry.files:
        data = files[record.name]
        if len(data) != record.size or hashlib.sha256(data).hexdigest() != record.sha256:
            raise CorruptEntry(f"{record.name} does not match its recorded sha256")
    return entry, files


def embedded_paths(files: dict[str, bytes]) -> tuple[str, ...]:
    """The absolute paths the files hold: quoted ones in a kernel's metadata, IR and PTX (where its sources and
    libdevice were), C strings in a module (the Python headers its asserts name)."""
    found: set[str] = set()
    for data in files.values():
        for pattern in (_QUOTED_PATH, _C_STRING_PATH):
            found.update(m.decode("utf-8", "replace") for m in pattern.findall(data))
    return tuple(sorted(found))


def valid_key(key: str) -> bool:
    return bool(_KEY.fullmatch(key))


def _decompress(blob: bytes) -> bytes:
    import zstandard

    out = bytearray()
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob), read_across_frames=False)
        while chunk := reader.read(1 << 20):
            out += chunk
            if len(out) > MAX_BYTES:
                raise CorruptEntry(f"expands beyond {MAX_BYTES} bytes")
    except zstandard.ZstdError as exc:
        raise CorruptEntry(f"not a zstd frame: {exc}") from None
    return bytes(out)


def _members(data: bytes) -> list[tuple[str, bytes]]:
    found = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar:
                if not info.isreg() or not _NAME.fullmatch(info.name):
                    raise CorruptEntry(f"member {info.name!r} is not a plain file name")
                handle = tar.extractfile(info)
                found.append((info.name, handle.read() if handle else b""))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise CorruptEntry(f"not a complete tar: {exc}") from None
    return found


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = len(data), 0o644, 0, tarfile.REGTYPE
    tar.addfile(info, io.BytesIO(data))
