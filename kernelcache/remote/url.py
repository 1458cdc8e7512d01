"""Bundles at URLs: ``file://`` with the standard library, everything else through fsspec.

``http(s)://`` needs ``kernelcache[remote]`` (fsspec with aiohttp); ``s3://``, ``gs://``, ``az://``
and the rest need their fsspec backend (s3fs, gcsfs, adlfs), which fsspec names when it is
missing. A URL may pin the file's sha256 the way pip does: ``https://host/b.tar.zst#sha256=HEX``.
Whatever the URL, the file lands only once it has verified (``transfer.land``). A signature at the URL with
``.sig`` appended (``kernelcache sign``'s file, bundle/signature.py) lands beside it; where there is none, a stale
one beside the file is removed.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

from ..bundle.signature import MAX_FILE_BYTES, keep_beside
from ..bundle.trust import SUFFIX
from ..errors import KernelcacheError, MissingDependency, RemoteError, UsageError
from ..format.manifest import Manifest
from .transfer import Expected, Landed, land, safe_name

CHUNK = 1 << 20
_PIN = re.compile(r"sha256=([0-9a-f]{64})")


class _Missing(RemoteError):
    """Nothing at the URL (a missing signature is no error)."""


def split_pin(url: str) -> tuple[str, str | None]:
    """``URL#sha256=HEX`` -> (URL, HEX); any other fragment is a usage error."""
    location, _, fragment = url.partition("#")
    if not fragment:
        return location, None
    match = _PIN.fullmatch(fragment)
    if match is None:
        raise UsageError(f"unknown URL fragment #{fragment}: the only one understood is #sha256=<64 hex digits>")
    return location, match.group(1)


def pull(url: str, output_dir: str | os.PathLike, verify_members: bool = True,
         accept: Callable[[Manifest], None] | None = None) -> list[Landed]:
    location, pin = split_pin(url)
    parts = urllib.parse.urlsplit(location)
    name = safe_name(urllib.parse.unquote(parts.path.rstrip("/").rsplit("/", 1)[-1]), "bundle.tar.zst")
    chunks = _file_chunks(parts, url) if parts.scheme == "file" else _fsspec_chunks(location, parts.scheme)
    landed = land(chunks, Path(output_dir) / name, Expected(sha256=pin), url, verify_members, accept)
    keep_beside(landed.path, _signature(location + SUFFIX))
    return [landed]


def _signature(location: str) -> bytes | None:
    """The bytes of the signature file at ``location`` (None when there is none), up to one byte past the size a
    signature file may have, so an oversized one reads as invalid."""
    parts = urllib.parse.urlsplit(location)
    chunks = _file_chunks(parts, location) if parts.scheme == "file" else _fsspec_chunks(location, parts.scheme)
    data = b""
    try:
        for chunk in chunks:
            data += chunk
            if len(data) > MAX_FILE_BYTES:
                break
    except _Missing:
        return None
    return data[:MAX_FILE_BYTES + 1]


def _file_chunks(parts: urllib.parse.SplitResult, url: str) -> Iterator[bytes]:
    if parts.netloc not in ("", "localhost"):
        raise UsageError(f"{url}: file:// URLs name a local path (file:///path), not host {parts.netloc!r}")
    path = Path(urllib.parse.unquote(parts.path))
    try:
        with open(path, "rb") as handle:
            yield from iter(lambda: handle.read(CHUNK), b"")
    except FileNotFoundError as exc:
        raise _Missing(f"cannot read {url}: {exc.strerror or exc}") from None
    except OSError as exc:
        raise RemoteError(f"cannot read {url}: {exc.strerror or exc}") from None


def _fsspec_chunks(location: str, scheme: str) -> Iterator[bytes]:
    handle = _open(location, scheme)
    try:
        with handle:
            while True:
                chunk = handle.read(CHUNK)
                if not chunk:
                    return
                yield chunk
    except KernelcacheError:
        raise
    except FileNotFoundError:
        raise _Missing(f"{location}: not found") from None
    except Exception as exc:  # each fsspec backend raises its own transport errors
        raise RemoteError(f"{location}: the download failed: {type(exc).__name__}: {exc}") from None


def _open(location: str, scheme: str):
    try:
        import fsspec
    except ImportError:
        raise MissingDependency(f"{scheme}:// URLs need fsspec: pip install 'kernelcache[remote]'") from None
    try:
        fs, path = fsspec.core.url_to_fs(location)
    except ImportError as exc:
        raise MissingDependency(f"{scheme}:// URLs need fsspec's {scheme} backend: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"{location}: no fsspec backend for {scheme}:// ({exc})") from None
    except Exception as exc:  # backends that connect when made (ftp, sftp) raise their transport errors here
        raise RemoteError(f"{location}: cannot connect: {type(exc).__name__}: {exc}") from None
    options = {"block_size": 0} if scheme in ("http", "https") else {}  # one streaming GET, no range requests
    try:
        return fs.open(path, "rb", **options)
    except FileNotFoundError:
        raise _Missing(f"{location}: not found") from None
    except Exception as exc:
        raise RemoteError(f"{location}: cannot open: {type(exc).__name__}: {exc}") from None
