"""Where build-cache blobs live: a local directory, a URL (fsspec) or an OCI registry, behind one interface.

A store keeps blobs (buildcache/blob.py) by Triton cache key and variant (the digest of the paths an entry
embeds: one per install location) and has two verbs: ``get(key)``, every variant's blob of the key (usually one,
none on a miss), and ``put(key, variant, blob)``. A put replaces that variant's blob whole, so a reader gets an
old blob, a new one or none, never a torn one, and the last writer wins (any writer's blob serves: the same key
and paths compile to the same files).

* ``DirStore``: ``<root>/v1/<first 2 key characters>/<key>/<variant>.tar.zst``, written under a unique temporary
  name and renamed into place. A hit sets the blob's mtime, so ``prune`` removes the least recently used first.
* ``UrlStore`` (``s3://``, ``gs://``, ``file://``, any fsspec URL with a writable backend): the same layout
  under the URL. Object stores put a blob in one request; on ``file://`` it goes through a temporary name.
* ``OciStore`` (``oci://HOST/REPOSITORY``): each key is a tag of the repository, an OCI manifest (artifactType
  ``application/vnd.kernelcache.build-entry.v1``) with one layer per variant (the blob, its variant in the
  ``dev.kernelcache.variant`` annotation). The registry checks each layer's digest on upload, kernelcache again
  on download. A put re-reads the manifest and keeps the other variants' layers (the newest ``MAX_VARIANTS``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from .blob import CorruptEntry

LAYOUT = "v1"
SUFFIX = ".tar.zst"
ENTRY_ARTIFACT = "application/vnd.kernelcache.build-entry.v1"
ENTRY_MEDIA_TYPE = "application/vnd.kernelcache.build-entry.v1.tar+zstd"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
VARIANT_NOTE = "dev.kernelcache.variant"
MAX_VARIANTS = 8
CACHEDIR_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                "# This file is a cache directory tag created by kernelcache (its build cache).\n")


def key_dir(key: str) -> str:
    return f"{LAYOUT}/{key[:2]}/{key}"


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

    def get(self, key: str) -> list[bytes]:
        found = []
        for path in _variants(self.root / key_dir(key)):
            with contextlib.suppress(FileNotFoundError):  # pruned since the listing: one variant fewer
                found.append(path.read_bytes())
                with contextlib.suppress(OSError):  # a read-only cache still serves; it only loses the LRU order
                    os.utime(path)
        return found

    def put(self, key: str, variant: str, blob: bytes) -> None:
        folder = self.root / key_dir(key)
        folder.mkdir(parents=True, exist_ok=True)
        self._tag()
        tmp = folder / f".{variant}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as handle:
                handle.write(blob)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, folder / f"{variant}{SUFFIX}")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def blobs(self) -> list[Blob]:
        """Every blob, least recently used first (temporary files of writers are not blobs)."""
        found = []
        for folder in sorted((self.root / LAYOUT).glob("??/*")):
            for path in _variants(folder):
                with contextlib.suppress(FileNotFoundError):
                    info = path.stat()
                    found.append(Blob(folder.name, path, info.st_blocks * 512, info.st_mtime))
        return sorted(found, key=lambda b: (b.used, str(b.path)))

    def remove(self, blob: Blob) -> bool:
        """Unlink one blob (a reader that opened it still reads it whole); False when it was gone already."""
        try:
            blob.path.unlink()
        except FileNotFoundError:
            return False
        with contextlib.suppress(OSError):  # the key's folder goes with its last blob (not while one is written)
            blob.path.parent.rmdir()
        return True

    def _tag(self) -> None:
        tag = self.root / "CACHEDIR.TAG"
        if not tag.exists():
            with contextlib.suppress(OSError):
                tag.write_text(CACHEDIR_TAG)


def _variants(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as items:
            return sorted(Path(i.path) for i in items if i.name.endswith(SUFFIX) and not i.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []


# -- a URL -------------------------------------------------------------------------------------------


class UrlStore:
    def __init__(self, url: str):
        from ..remote.url import split_pin

        self.url = split_pin(url)[0].rstrip("/")
        self.fs, self.base = _filesystem(self.url)

    def get(self, key: str) -> list[bytes]:
        try:
            listed = self.fs.ls(f"{self.base}/{key_dir(key)}", detail=False)
        except FileNotFoundError:
            return []
        found = []
        for path in sorted(p for p in listed if p.endswith(SUFFIX) and not p.rsplit("/", 1)[-1].startswith(".")):
            with contextlib.suppress(FileNotFoundError):
                found.append(self.fs.cat_file(path))
        return found

    def put(self, key: str, variant: str, blob: bytes) -> None:
        folder = f"{self.base}/{key_dir(key)}"
        if not _is_local(self.fs):  # an object store publishes a whole object per request
            self.fs.pipe_file(f"{folder}/{variant}{SUFFIX}", blob)
            return
        self.fs.makedirs(folder, exist_ok=True)
        tmp = f"{folder}/.{variant}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
        self.fs.pipe_file(tmp, blob)
        self.fs.mv(tmp, f"{folder}/{variant}{SUFFIX}")

    def check(self) -> None:
        """Reach the store once (the transport's exception when it cannot be)."""
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
        self._empty: dict | None = None  # the config descriptor, once its blob is uploaded

    @property
    def client(self):
        if self._client is None:
            from ..remote.oci import _connect

            self._client = _connect(self.ref)
        return self._client

    def get(self, key: str) -> list[bytes]:
        from ..remote.oci import _blob_chunks

        ref = self.ref.at(key)
        found = []
        for layer in self._layers(key):
            blob = b"".join(_blob_chunks(self.client, ref, layer["digest"]))
            if "sha256:" + hashlib.sha256(blob).hexdigest() != layer["digest"]:
                raise CorruptEntry(f"a layer of {ref} is not the blob its digest names")
            found.append(blob)
        return found

    def put(self, key: str, variant: str, blob: bytes) -> None:
        import tempfile

        from ..remote.oci import OCI_MANIFEST, _canonical, _put_manifest, _upload

        ref = self.ref.at(key)
        with tempfile.TemporaryDirectory(prefix="kernelcache-entry-") as work:
            path = Path(work) / f"{variant}{SUFFIX}"
            path.write_bytes(blob)
            layer = {**_upload(self.client, ref, path, ENTRY_MEDIA_TYPE), "annotations": {VARIANT_NOTE: variant}}
            if self._empty is None:
                (Path(work) / "empty.json").write_bytes(b"{}")
                self._empty = _upload(self.client, ref, Path(work) / "empty.json", EMPTY_MEDIA_TYPE)
        others = [x for x in self._layers(key) if (x.get("annotations") or {}).get(VARIANT_NOTE) != variant]
        document = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ENTRY_ARTIFACT,
                    "config": self._empty, "layers": [layer, *others][:MAX_VARIANTS]}
        _put_manifest(self.client, ref, _canonical(document), OCI_MANIFEST)

    def check(self) -> None:
        """Reach the registry once (``RemoteError`` when it cannot be)."""
        from ..errors import RemoteError
        from ..remote.registry import error_text

        response = self.client.do_request(f"{self.client.prefix}://{self.ref.host}/v2/", "GET")
        if response.status_code not in (200, 401):
            raise RemoteError(f"{self.ref.host} is not an OCI registry: {error_text(response)}")

    def _layers(self, key: str) -> list[dict]:
        """The entry layers of the key's manifest (none when the tag does not exist)."""
        from ..errors import RemoteError
        from ..remote.oci import _get_manifest

        ref = self.ref.at(key)
        found = _get_manifest(self.client, ref, missing_ok=True)
        if found is None:
            return []
        document = found[1]
        if document.get("artifactType") != ENTRY_ARTIFACT:
            raise RemoteError(f"{ref} is not a kernelcache build-cache entry")
        return [x for x in document.get("layers") or [] if x.get("mediaType") == ENTRY_MEDIA_TYPE]
