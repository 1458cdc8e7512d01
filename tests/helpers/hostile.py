"""Hand-made hostile and broken bundles: raw tar streams that kernelcache's writer would never produce.

Each ``Case`` builds the bytes of one bad bundle from a small valid one (``Base``) and names the
error class it must be refused with. ``archive.write`` refuses to write most of these, so they are
assembled here with ``tarfile`` and ``zstandard`` directly.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import random
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zstandard

from kernelcache.errors import (
    BundleError,
    BundleFormatError,
    BundleManifestError,
    EntryError,
    IntegrityError,
    LimitExceededError,
    UnsafeMemberError,
)
from kernelcache.format import archive
from kernelcache.format.manifest import MANIFEST_NAME

GiB = 1 << 30


@dataclass
class Base:
    """A small valid bundle, taken apart: manifest dict and members in order."""

    manifest: dict
    members: list[tuple[str, bytes]]
    escape: Path  # where an escaping member would land; must not exist afterwards

    @property
    def kernel(self) -> dict:
        return self.manifest["kernels"][0]

    def member(self, suffix: str) -> tuple[str, bytes]:
        return next((n, d) for n, d in self.members if n.endswith(suffix))


@dataclass(frozen=True)
class Case:
    name: str
    error: type[BundleError]
    build: Callable[[Base], bytes]
    limits: dict | None = None  # CLI limit flags for this case


def load_base(bundle: Path, escape: Path) -> Base:
    manifest = archive.read_manifest(bundle).to_dict()
    members = [(name, data) for _, name, data in archive.iter_members(bundle)]
    return Base(manifest, members, escape)


def subset(bundle: Path, out: Path, kernels: int = 3, modules: int = 1) -> Path:
    """A valid bundle holding the first few kernels and modules of ``bundle`` (fast to test with)."""
    import dataclasses

    manifest = archive.read_manifest(bundle)
    small = dataclasses.replace(manifest, kernels=manifest.kernels[:kernels], modules=manifest.modules[:modules])
    keep = {f.path for f in small.files()}
    data = {name: blob for _, name, blob in archive.iter_members(bundle) if name in keep}
    return archive.write(out, small, [(name, lambda blob=blob: blob) for name, blob in data.items()])


# -- raw writers -----------------------------------------------------------------------------------


def info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE, link: str = "", pax: dict | None = None):
    member = tarfile.TarInfo(name)
    member.size, member.type, member.linkname, member.mode = size, kind, link, 0o644
    if pax:
        member.pax_headers = pax
    return member


def tar(entries, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as out:
        for member, data in entries:
            out.addfile(member, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data)


def regular(name: str, data: bytes):
    return info(name, len(data)), data


def manifest_json(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()


def bundle(base: Base, manifest: dict | bytes | None = None, members=None, extra_first=(), fmt=tarfile.PAX_FORMAT,
           tail: bytes = b"") -> bytes:
    """A bundle from ``base`` with the manifest and/or member list replaced; ``tail`` goes after the tar."""
    body = manifest if isinstance(manifest, bytes) else manifest_json(manifest or base.manifest)
    listed = [regular(n, d) for n, d in base.members] if members is None else members
    return zst(tar([*extra_first, regular(MANIFEST_NAME, body), *listed], fmt) + tail)


def record(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def with_member(base: Base, member, data: bytes, listed_as: str | None = None) -> bytes:
    """``base`` plus one extra tar member, optionally also listed in the manifest (in kernel 0)."""
    manifest = copy.deepcopy(base.manifest)
    if listed_as is not None:
        manifest["kernels"][0]["files"].append(record(listed_as, data if member.isreg() else b""))
    return bundle(base, manifest, [*[regular(n, d) for n, d in base.members], (member, data)])


def edit_manifest(change: Callable[[dict], None]) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        manifest = copy.deepcopy(base.manifest)
        change(manifest)
        return bundle(base, manifest)
    return build


def replace_member(suffix: str, new: bytes, relist: bool = True) -> Callable[[Base], bytes]:
    """Swap one member's bytes; with ``relist`` the manifest's size and sha256 follow (consistent)."""
    def build(base: Base) -> bytes:
        manifest = copy.deepcopy(base.manifest)
        name, _ = base.member(suffix)
        if relist:
            for item in manifest["kernels"]:
                item["files"] = [record(name, new) if f["path"] == name else f for f in item["files"]]
        members = [regular(n, new if n == name else d) for n, d in base.members]
        return bundle(base, manifest, members)
    return build


def _zero_bomb(base: Base) -> bytes:
    """A valid tar, then 1 GiB of zeros: 32 KiB compressed."""
    head = tar([regular(MANIFEST_NAME, manifest_json(base.manifest)), *[regular(n, d) for n, d in base.members]])
    compressor = zstandard.ZstdCompressor(level=1, write_checksum=True).compressobj()
    zeros = bytes(16 << 20)
    parts = [compressor.compress(head), *(compressor.compress(zeros) for _ in range(64)), compressor.flush()]
    return b"".join(parts)


def _pax_bomb(before_manifest: bool) -> Callable[[Base], bytes]:
    """A PAX header whose value is 128 MiB: tarfile would read it whole into memory."""
    def build(base: Base) -> bytes:
        name, data = base.members[0]
        bomb = info(name, len(data), pax={"comment": "x" * (128 << 20)})
        entries = [regular(MANIFEST_NAME, manifest_json(base.manifest))]
        rest = [regular(n, d) for n, d in base.members[1:]]
        entries = [(bomb, data), *entries, *rest] if before_manifest else [*entries, (bomb, data), *rest]
        compressor = zstandard.ZstdCompressor(level=1, write_checksum=True)
        return compressor.compress(tar(entries))
    return build


def _header_chain(before_manifest: bool, count: int = 2000) -> Callable[[Base], bytes]:
    """``count`` pax extended headers in a row, each a harmless comment: tarfile recurses once per header."""
    def blob(member: tarfile.TarInfo, data: bytes) -> bytes:
        return member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + b"\0" * (-len(data) % 512)

    def build(base: Base) -> bytes:
        record = b"13 comment=x\n"
        chain = blob(info("././@PaxHeader", len(record), tarfile.XHDTYPE), record) * count
        manifest = blob(*regular(MANIFEST_NAME, manifest_json(base.manifest)))
        members = b"".join(blob(*regular(n, d)) for n, d in base.members)
        body = chain + manifest + members if before_manifest else manifest + chain + members
        body += b"\0" * 1024
        return zst(body + b"\0" * (-len(body) % tarfile.RECORDSIZE))
    return build


def _sparse(base: Base) -> bytes:
    """A GNU sparse member (PAX 1.0): 512 bytes stored, 1 GiB when expanded."""
    name, _ = base.member(".cubin")
    data = b"1\n0\n512\n".ljust(512, b"\0") + b"y" * 512
    sparse = info(name, len(data), pax={"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": name,
                                        "GNU.sparse.realsize": str(GiB)})
    members = [(sparse, data) if n == name else regular(n, d) for n, d in base.members]
    return bundle(base, None, members)


def _symlink_then_write(base: Base) -> bytes:
    """The classic escape: a directory symlink pointing outside, then a file written through it."""
    key = "B" * 52
    manifest = copy.deepcopy(base.manifest)
    manifest["modules"].append({"kind": "other", "key": key, "files": [record(f"{key}/escaped.so", b"pwned")]})
    link = info(key, kind=tarfile.SYMTYPE, link=str(base.escape.parent))
    return bundle(base, manifest, [*[regular(n, d) for n, d in base.members], (link, None),
                                   regular(f"{key}/escaped.so", b"pwned")])


def _duplicate(base: Base) -> bytes:
    name, data = base.members[0]
    return bundle(base, None, [regular(name, data), *[regular(n, d) for n, d in base.members]])


def _duplicate_manifest(base: Base) -> bytes:
    return bundle(base, None, [*[regular(n, d) for n, d in base.members],
                               regular(MANIFEST_NAME, manifest_json(base.manifest))])


def _resized(delta: int) -> Callable[[Base], bytes]:
    """One member's tar header (and data) ``delta`` bytes off what the manifest says."""
    def build(base: Base) -> bytes:
        name, data = base.member(".cubin")
        new = data + b"\0" * delta if delta > 0 else data[:delta]
        return bundle(base, None, [regular(n, new if n == name else d) for n, d in base.members])
    return build


def _unlisted(base: Base) -> bytes:
    return bundle(base, None, [*[regular(n, d) for n, d in base.members],
                               regular(f"{base.kernel['key']}/extra.cubin", b"not in the manifest")])


def _missing(base: Base) -> bytes:
    return bundle(base, None, [regular(n, d) for n, d in base.members[1:]])


def _sha_mismatch(base: Base) -> bytes:
    name, data = base.member(".cubin")
    flipped = bytes([data[0] ^ 1]) + data[1:]
    return bundle(base, None, [regular(n, flipped if n == name else d) for n, d in base.members])


def _no_manifest(base: Base) -> bytes:
    return zst(tar([regular(n, d) for n, d in base.members]))


def _manifest_second(base: Base) -> bytes:
    name, data = base.members[0]
    return zst(tar([regular(name, data), regular(MANIFEST_NAME, manifest_json(base.manifest)),
                    *[regular(n, d) for n, d in base.members[1:]]]))


def _manifest_symlink(base: Base) -> bytes:
    return zst(tar([(info(MANIFEST_NAME, kind=tarfile.SYMTYPE, link="/etc/passwd"), None),
                    *[regular(n, d) for n, d in base.members]]))


def _valid(base: Base) -> bytes:
    return bundle(base)


def _truncated(fraction: float | int) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        data = _valid(base)
        cut = int(len(data) * fraction) if isinstance(fraction, float) else len(data) + fraction
        return data[:cut]
    return build


def _trailing(extra: Callable[[Base], bytes]) -> Callable[[Base], bytes]:
    return lambda base: _valid(base) + extra(base)


def _corrupt_checksum(base: Base) -> bytes:
    data = bytearray(_valid(base))
    data[-1] ^= 0xFF
    return bytes(data)


def _name(name: str, fmt: int = tarfile.PAX_FORMAT, listed: bool = False) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        path = name.format(key=base.kernel["key"], escape=base.escape)
        member = info(path, 5)
        manifest = copy.deepcopy(base.manifest)
        if listed:
            manifest["kernels"][0]["files"].append(record(path, b"pwned"))
        return bundle(base, manifest, [*[regular(n, d) for n, d in base.members], (member, b"pwned")], fmt=fmt)
    return build


def _special(kind: bytes, link: str = "") -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        path = f"{base.kernel['key']}/special.cubin"
        return with_member(base, info(path, kind=kind, link=link.format(escape=base.escape)), None, listed_as=path)
    return build


def _set(path: tuple, value) -> Callable[[dict], None]:
    def change(manifest: dict) -> None:
        node = manifest
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
    return change


def _kernel_file(path_of: Callable[[dict], str]) -> Callable[[Base], bytes]:
    def change(manifest: dict) -> None:
        kernel = manifest["kernels"][0]
        kernel["files"].append(record(path_of(kernel), b""))
    return edit_manifest(change)


def _drop_group(manifest: dict) -> None:
    kernel = manifest["kernels"][0]
    kernel["files"] = [f for f in kernel["files"] if "__grp__" not in f["path"]]


def _group_of_first(content: bytes) -> Callable[[Base], bytes]:
    def build(base: Base) -> bytes:
        kernel = base.kernel
        return replace_member(f"{kernel['key']}/__grp__{kernel['name']}.json", content)(base)
    return build


CASES: list[Case] = [
    # names: traversal, absolute, odd characters, depth
    Case("traversal-dotdot", UnsafeMemberError, _name("../escaped.txt")),
    Case("traversal-dotdot-listed", UnsafeMemberError, _name("../escaped.txt", listed=True)),
    Case("traversal-nested", UnsafeMemberError, _name("{key}/../../escaped.txt")),
    Case("traversal-dot", UnsafeMemberError, _name("{key}/./x.cubin")),
    Case("absolute-path", UnsafeMemberError, _name("{escape}")),
    Case("absolute-path-listed", UnsafeMemberError, _name("{escape}", listed=True)),
    Case("empty-component", UnsafeMemberError, _name("{key}//x.cubin")),
    Case("newline-in-name", UnsafeMemberError, _name("{key}/x\n.cubin")),
    Case("odd-bytes-in-name", UnsafeMemberError, _name("{key}/\udcff\udcfe.cubin", fmt=tarfile.GNU_FORMAT)),
    Case("escape-sequence-in-name", UnsafeMemberError, _name("{key}/\x1b[2J.cubin")),
    Case("non-ascii-name", UnsafeMemberError, _name("{key}/ñ.cubin")),
    Case("backslash-in-name", UnsafeMemberError, _name("{key}/..\\..\\x.cubin")),
    Case("leading-dash", UnsafeMemberError, _name("{key}/-rf")),
    Case("hidden-dir", UnsafeMemberError, _name(".kernelcache/installed/x.json")),
    Case("component-too-long", UnsafeMemberError, _name("{key}/" + "a" * 201)),
    Case("too-deep", UnsafeMemberError, _name("{key}/a/b/c/d.cubin")),
    # links, devices, fifos, directories, sparse files
    Case("symlink-inside", UnsafeMemberError, _special(tarfile.SYMTYPE, "x.cubin")),
    Case("symlink-outside", UnsafeMemberError, _special(tarfile.SYMTYPE, "{escape}")),
    Case("symlink-dir-then-write-through", UnsafeMemberError, _symlink_then_write),
    Case("hardlink-inside", UnsafeMemberError, _special(tarfile.LNKTYPE, "x.cubin")),
    Case("hardlink-outside", UnsafeMemberError, _special(tarfile.LNKTYPE, "/etc/passwd")),
    Case("char-device", UnsafeMemberError, _special(tarfile.CHRTYPE)),
    Case("block-device", UnsafeMemberError, _special(tarfile.BLKTYPE)),
    Case("fifo", UnsafeMemberError, _special(tarfile.FIFOTYPE)),
    Case("directory-member", UnsafeMemberError, _special(tarfile.DIRTYPE)),
    Case("gnu-sparse-member", UnsafeMemberError, _sparse),
    Case("manifest-is-a-symlink", UnsafeMemberError, _manifest_symlink),
    # duplicates, sizes, members vs manifest, hashes
    Case("duplicate-member", UnsafeMemberError, _duplicate),
    Case("duplicate-manifest", UnsafeMemberError, _duplicate_manifest),
    Case("member-larger-than-manifest", IntegrityError, _resized(+700)),
    Case("member-smaller-than-manifest", IntegrityError, _resized(-1)),
    Case("member-not-in-manifest", IntegrityError, _unlisted),
    Case("member-missing", IntegrityError, _missing),
    Case("sha256-mismatch", IntegrityError, _sha_mismatch),
    # bombs and limits
    Case("zstd-bomb-trailing-zeros", LimitExceededError, _zero_bomb),
    Case("pax-header-bomb-before-manifest", LimitExceededError, _pax_bomb(True)),
    Case("pax-header-bomb-after-manifest", LimitExceededError, _pax_bomb(False)),
    Case("pax-header-chain-before-manifest", BundleFormatError, _header_chain(True)),
    # After the manifest the cap on what a tar of its members can take stops the chain about 100 headers in,
    # before tarfile's recursion would (the cap holds to the byte: each read asks zstd for no more than is left).
    Case("pax-header-chain-after-manifest", LimitExceededError, _header_chain(False)),
    Case("over-total-limit", LimitExceededError, _valid, {"--max-total": "16K"}),
    Case("over-member-limit", LimitExceededError, _valid, {"--max-member": "4K"}),
    Case("over-member-count-limit", LimitExceededError, _valid, {"--max-members": "4"}),
    Case("member-declares-2TiB", LimitExceededError, edit_manifest(
        lambda m: m["kernels"][0]["files"].__setitem__(0, {**m["kernels"][0]["files"][0], "size": 2 << 40}))),
    # the manifest
    Case("manifest-missing", BundleManifestError, _no_manifest),
    Case("manifest-not-first", BundleManifestError, _manifest_second),
    Case("manifest-not-json", BundleManifestError, lambda b: bundle(b, b"{this is not json")),
    Case("manifest-not-utf8", BundleManifestError, lambda b: bundle(b, b"\xff\xfe{}")),
    Case("manifest-json-array", BundleManifestError, lambda b: bundle(b, b"[1, 2, 3]")),
    Case("manifest-empty", BundleManifestError, lambda b: bundle(b, b"")),
    Case("manifest-unknown-schema-version", BundleManifestError, edit_manifest(_set(("format_version",), 2))),
    Case("manifest-no-schema-version", BundleManifestError, edit_manifest(lambda m: m.pop("format_version"))),
    Case("manifest-unknown-kernel-field", BundleManifestError, edit_manifest(_set(("kernels", 0, "surprise"), 1))),
    Case("manifest-kernels-not-a-list", BundleManifestError, edit_manifest(_set(("kernels",), "nope"))),
    Case("manifest-bad-sha256-text", BundleManifestError, edit_manifest(
        lambda m: m["kernels"][0]["files"][0].__setitem__("sha256", "g" * 64))),
    Case("manifest-negative-size", BundleManifestError, edit_manifest(
        lambda m: m["kernels"][0]["files"][0].__setitem__("size", -1))),
    Case("manifest-duplicate-path", BundleManifestError, edit_manifest(
        lambda m: m["kernels"][0]["files"].append(m["kernels"][0]["files"][0]))),
    Case("manifest-file-where-dir-is", BundleManifestError, _kernel_file(lambda k: f"{k['files'][0]['path']}/inner")),
    Case("manifest-top-level-file", BundleManifestError, _kernel_file(lambda k: "toplevel.cubin")),
    # entries: keys, layout, group files
    Case("entry-key-not-base32", EntryError, edit_manifest(
        lambda m: m["kernels"][0].__setitem__("key", "not_a_key"))),
    Case("entry-file-outside-its-dir", EntryError, _kernel_file(lambda k: f"{'A' * 52}/x.cubin")),
    Case("entry-without-group-file", EntryError, edit_manifest(_drop_group)),
    Case("group-file-not-json", EntryError, _group_of_first(b"{not json")),
    Case("group-file-no-child-paths", EntryError, _group_of_first(b'{"children": {}}')),
    Case("group-file-child-paths-list", EntryError, _group_of_first(b'{"child_paths": ["a"]}')),
    Case("group-file-names-outside-file", EntryError, _group_of_first(
        b'{"child_paths": {"passwd": "../../../../etc/passwd"}}')),
    # the container: not zstd, not tar, truncated, trailing data, checksum
    Case("empty-file", BundleFormatError, lambda b: b""),
    Case("plain-tar-not-zstd", BundleFormatError, lambda b: tar([regular(MANIFEST_NAME, manifest_json(b.manifest))])),
    Case("gzip-not-zstd", BundleFormatError, lambda b: __import__("gzip").compress(tar([]))),
    Case("zstd-of-random-bytes", BundleFormatError, lambda b: zst(random.Random(1).randbytes(4096))),
    Case("zstd-of-nothing", BundleFormatError, lambda b: zst(b"")),
    Case("truncated-in-manifest", BundleFormatError, _truncated(0.02)),
    Case("truncated-at-quarter", BundleFormatError, _truncated(0.25)),
    Case("truncated-at-half", BundleFormatError, _truncated(0.5)),
    Case("truncated-at-three-quarters", BundleFormatError, _truncated(0.75)),
    Case("truncated-checksum", BundleFormatError, _truncated(-4)),
    Case("truncated-last-byte", BundleFormatError, _truncated(-1)),
    Case("zstd-checksum-wrong", BundleFormatError, _corrupt_checksum),
    Case("trailing-garbage", BundleFormatError, _trailing(lambda b: b"garbage after the frame")),
    Case("trailing-second-frame", BundleFormatError, _trailing(lambda b: zst(b"\0" * 1024))),
]


def flips(data: bytes, count: int, seed: int) -> list[tuple[int, int, bytes]]:
    """``count`` seeded single-bit flips of ``data``: (byte offset, bit, flipped bytes)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        offset, bit = rng.randrange(len(data)), rng.randrange(8)
        flipped = bytearray(data)
        flipped[offset] ^= 1 << bit
        out.append((offset, bit, bytes(flipped)))
    return out
