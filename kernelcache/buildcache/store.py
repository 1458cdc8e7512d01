"""Where build-cache blobs live: a local directory, a URL (fsspec) or an OCI registry, behind one interface.

Every store maps a Triton cache key to one blob (buildcache/entry.py) and has two verbs: ``get(key)`` (the blob,
or None) and ``put(key, blob)``. A put replaces the key's blob whole, so a reader gets an old blob, a new one or
none, never a torn one, and the last writer of a key wins (any writer's blob serves: the same key compiles the
same files).

* ``DirStore``: ``<root>/v1/<first 2 key characters>/<key>.tar.zst``, written under a unique temporary name and
  renamed into place. A hit sets the blob's mtime, so ``prune`` removes the least recently used first.
* ``UrlStore`` (``s3://``, ``gs://``, ``file://``, any fsspec URL with a writable backend): the same layout
  under the URL. Object stores put a blob in one request; on ``file://`` it goes through a temporary name.
* ``OciStore`` (``oci://HOST/REPOSITORY``): each key is a tag of the repository, an OCI manifest (artifactType
  ``application/vnd.kernelcache.build-entry.v1``) whose one layer is the blob; the registry verifies the
  layer's digest and kernelcache verifies it again on download.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from .entry import CorruptEntry

LAYOUT = "v1"
SUFFIX = ".tar.zst"
ENTRY_ARTIFACT = "application/vnd.kernelcache.build-entry.v1"
ENTRY_MEDIA_TYPE = "application/vnd.kernelcache.build-entry.v1.tar+zstd"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
CACHEDIR_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                "# This file is a cache directory tag created by kernelcache (its build cache).\n")


def relative(key: str) -> str:
    return f"{LAYOUT}/{key[:2]}/{key}{SUFFIX}"


# -- a local directory -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    key: str
    path: Path
    size: int  # bytes allocated on disk
    used: float  # mtime: when it was written or last reused


class DirStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def get(self, key: str) -> bytes | None:
        path = self.root / relative(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        with contextlib.suppress(OSError):  # a read-only cache still serves; it only loses the LRU order
            os.utime(path)
        return data

    def put(self, key: str, blob: bytes) -> None:
        path = self.root / relative(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._tag()
        tmp = path.with_name(f".{key}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as handle:
                handle.write(blob)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def blobs(self) -> list[Blob]:
        """Every blob, least recently used first (temporary files of writers are not blobs)."""
        found = []
        for folder in sorted((self.root / LAYOUT).glob("??")):
            with contextlib.suppress(OSError), os.scandir(folder) as items:
                for item in items:
                    if item.name.endswith(SUFFIX) and not item.name.startswith(".") and item.is_file():
                        info = item.stat()
                        found.append(Blob(item.name[:-len(SUFFIX)], Path(item.path), info.st_blocks * 512,
                                          info.st_mtime))
        return sorted(found, key=lambda b: (b.used, b.key))

    def remove(self, blob: Blob) -> bool:
        """Unlink one blob (a reader that opened it still reads it whole); False when it was gone already."""
        try:
            blob.path.unlink()
        except FileNotFoundError:
            return False
        return True

    def _tag(self) -> None:
        tag = self.root / "CACHEDIR.TAG"
        if not tag.exists():
            with contextlib.suppress(OSError):
                tag.write_text(CACHEDIR_TAG)


# -- a URL -------------------------------------------------------------------------------------------


class UrlStore:
    def __init__(self, url: str):
        from ..remote.url import split_pin

        self.url = split_pin(url)[0].rstrip("/")
        self.fs, self.base = _filesystem(self.url)

    def get(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(f"{self.base}/{relative(key)}")
        except FileNotFoundError:
            return None

    def put(self, key: str, blob: bytes) -> None:
        path = f"{self.base}/{relative(key)}"
        if not _is_local(self.fs):  # an object store publishes a whole object per request
            self.fs.pipe_file(path, blob)
            return
        tmp = f"{self.base}/{LAYOUT}/{key[:2]}/.{key}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        self.fs.makedirs(f"{self.base}/{LAYOUT}/{key[:2]}", exist_ok=True)
        self.fs.pipe_file(tmp, blob)
        self.fs.mv(tmp, path)

    def check(self) -> None:
        """Reach the store once (``RemoteError`` when it cannot be)."""
        if _is_local(self.fs):
            self.fs.makedirs(self.base, exist_ok=True)
        else:
            self.fs.exists(self.base)


def _filesystem(url: str):
    from ..errors import MissingDependency, UsageError

    scheme = url.split("://", 1)[0]
    try:
        import fsspec
    except ImportError:
        raise MissingDependency(f"--build-cache {scheme}:// needs fsspec: pip install 'kernelcache[remote]'") from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise MissingDependency(f"--build-cache {scheme}:// needs fsspec's {scheme} backend: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"--build-cache {url}: no fsspec backend for {scheme}:// ({exc})") from None


def _is_local(fs) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


# -- an OCI registry ---------------------------------------------------------------------------------


class OciStore:
    def __init__(self, url: str):
        from ..errors import UsageError
        from ..remote.oci import parse

        self.ref = parse(url)
        if url.rstrip("/") != f"oci://{self.ref.host}/{self.ref.repository}":
            raise UsageError(f"--build-cache {url}: name a repository, oci://HOST/REPOSITORY (each entry is a tag "
                             "in it), without a tag or digest")
        self._client = None
        self._empty_uploaded = False

    @property
    def client(self):
        if self._client is None:
            from ..remote.oci import _connect

            self._client = _connect(self.ref)
        return self._client

    def get(self, key: str) -> bytes | None:
        from ..errors import RemoteError
        from ..remote.oci import _blob_chunks, _get_manifest

        ref = self.ref.at(key)
        found = _get_manifest(self.client, ref, missing_ok=True)
        if found is None:
            return None
        _, document, _ = found
        layers = [x for x in document.get("layers") or [] if x.get("mediaType") == ENTRY_MEDIA_TYPE]
        if document.get("artifactType") != ENTRY_ARTIFACT or len(layers) != 1:
            raise RemoteError(f"{ref} is not a kernelcache build-cache entry")
        blob = b"".join(_blob_chunks(self.client, ref, layers[0]["digest"]))
        if "sha256:" + _sha256(blob) != layers[0]["digest"]:
            raise CorruptEntry(f"the layer of {ref} is not the blob its digest names")
        return blob

    def put(self, key: str, blob: bytes) -> None:
        import tempfile

        from ..remote.oci import OCI_MANIFEST, _canonical, _put_manifest, _upload

        ref = self.ref.at(key)
        with tempfile.TemporaryDirectory(prefix="kernelcache-entry-") as work:
            empty, layer = Path(work) / "empty.json", Path(work) / f"{key}{SUFFIX}"
            empty.write_bytes(b"{}")
            layer.write_bytes(blob)
            config = _upload(self.client, ref, empty, EMPTY_MEDIA_TYPE) if not self._empty_uploaded else {
                "mediaType": EMPTY_MEDIA_TYPE, "digest": "sha256:" + _sha256(b"{}"), "size": 2}
            self._empty_uploaded = True
            document = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ENTRY_ARTIFACT,
                        "config": config, "layers": [_upload(self.client, ref, layer, ENTRY_MEDIA_TYPE)]}
        _put_manifest(self.client, ref, _canonical(document), OCI_MANIFEST)

    def check(self) -> None:
        """Reach the registry once (``RemoteError`` when it cannot be)."""
        from ..errors import RemoteError
        from ..remote.registry import error_text

        response = self.client.do_request(f"{self.client.prefix}://{self.ref.host}/v2/", "GET")
        if response.status_code not in (200, 401):
            raise RemoteError(f"{self.ref.host} is not an OCI registry: {error_text(response)}")


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
