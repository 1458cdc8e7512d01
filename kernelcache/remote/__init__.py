"""Where a bundle comes from, chosen by the reference's scheme (as ccache picks remote storage).

* a plain path: used as it is;
* ``oci://HOST/REPO:TAG`` (or ``@sha256:…``): an OCI registry through oras (``remote.oci``); an
  index tag resolves to the bundle for the visible GPU or for ``arch`` / ``gpu``;
* ``file://``, ``http(s)://``, ``s3://``, ``gs://``, … : a URL (``remote.url``), optionally pinned
  with ``#sha256=HEX``.

``pull`` downloads into a directory and verifies every member; ``local_bundle`` gives a verified
local file for one command (install, diff, merge) and removes its download afterwards. Nothing
here imports oras or fsspec until a reference needs it.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ArchMismatch, StorageError, UsageError
from ..format.archive import read_manifest
from ..format.manifest import Manifest, Target, flag_capability

if TYPE_CHECKING:  # a plain path (every install) never loads the transports
    from .transfer import Landed

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_remote(ref: str | os.PathLike) -> bool:
    return bool(_SCHEME.match(str(ref)))


def pull(ref: str, output_dir: str | os.PathLike = ".", arch: str | None = None, gpu: str | None = None,
         every: bool = False, verify_members: bool = True) -> list[Landed]:
    """Download the bundle(s) ``ref`` names into ``output_dir``, verified, under their own names."""
    if not is_remote(ref):
        raise UsageError(f"{ref} is not a URL or oci:// reference; pull fetches remote bundles")
    check_wanted(arch, gpu)  # a bad --arch / --gpu fails before anything is downloaded

    def accept(manifest: Manifest) -> None:  # before the download takes its name (remote/transfer.py)
        if not every:
            check_target(manifest, arch, gpu, str(ref))

    if str(ref).startswith("oci://"):
        from .oci import pull as pull_oci

        return pull_oci(ref, output_dir, arch=arch, gpu=gpu, every=every, verify_members=verify_members,
                        accept=accept)
    if every:
        raise UsageError("--all picks every bundle of an OCI index; a URL names one bundle")
    from .url import pull as pull_url

    return pull_url(ref, output_dir, verify_members=verify_members, accept=accept)


def check_wanted(arch: str | None, gpu: str | None) -> None:
    if gpu is not None:
        from ..plan.gpus import profile

        profile(gpu)
    if arch is not None:
        flag_capability(arch)


def fetch(ref: str | os.PathLike, dest_dir: str | os.PathLike, arch: str | None = None, gpu: str | None = None,
          verify_members: bool = True) -> Path:
    """One local bundle for ``ref``: a path as is, a remote reference downloaded into ``dest_dir``."""
    if not is_remote(ref):
        path = Path(ref)
        if arch is not None or gpu is not None:
            check_target(read_manifest(path), arch, gpu, str(ref))
        return path
    return pull(str(ref), dest_dir, arch=arch, gpu=gpu, verify_members=verify_members)[0].path


@contextmanager
def local_bundle(ref: str | os.PathLike, arch: str | None = None, gpu: str | None = None,
                 verify_members: bool = False) -> Iterator[Path]:
    """A local file for ``ref`` while the block runs; a download goes to a temp dir removed after.

    ``verify_members`` is off by default because every user of this (install, diff, merge)
    verifies what it reads; the transport's own size and digest checks always run.
    """
    if not is_remote(ref):
        yield fetch(ref, ".", arch, gpu)
        return
    with _download_dir() as tmp:
        yield fetch(ref, tmp, arch, gpu, verify_members)


@contextmanager
def _download_dir() -> Iterator[str]:
    """A fresh temp dir under KERNELCACHE_DOWNLOAD_DIR (created if missing) or the system's."""
    parent = os.environ.get("KERNELCACHE_DOWNLOAD_DIR") or None
    try:
        if parent:
            Path(parent).mkdir(parents=True, exist_ok=True)
        work = tempfile.TemporaryDirectory(prefix="kernelcache-", dir=parent)
    except OSError as exc:
        raise StorageError(f"cannot create a download dir in {parent or tempfile.gettempdir()}: "
                           f"{exc.strerror or exc}") from None
    with work as path:
        yield path


def check_target(manifest: Manifest, arch: str | None, gpu: str | None, source: str) -> None:
    """An explicit ``--arch`` / ``--gpu`` refuses any bundle built for something else: another arch or SM count,
    or, where the device name decided its kernels, another product that does not get the same configs."""
    target = manifest.target
    if gpu is not None:
        from ..plan.gpus import profile

        want = profile(gpu)
        if not fits_profile(manifest, want):
            raise ArchMismatch(f"{source} was built for {_target(target)}, not for --gpu {want.name}",
                               [("target", _target(target), f"{want.name} ({want.arch}, {want.sm_count} SMs)")])
    if arch is not None and target.capability != flag_capability(arch, None):
        raise ArchMismatch(f"{source} was built for {_target(target)}, not for --arch {arch}",
                           [("target", _target(target), arch)])


def fits_profile(manifest: Manifest, want) -> bool:
    """Whether ``--gpu`` of the GPU profile ``want`` takes this bundle: its arch, its SM count, and where the device
    name decided its kernels, a product that gets the same configs."""
    target, keys = manifest.target, manifest.device_keys
    return target.capability == want.capability and (not target.sm_count or target.sm_count == want.sm_count) and (
        keys is None or keys.accepts(want.product))


def fits(manifest: Manifest) -> dict:
    """What a no-op install's record keeps of the bundle's target (cachedir/checked.py): the ``--arch`` values and
    the built-in ``--gpu`` profiles that take it, so a no-op ``install --gpu NAME`` is answered without reading it."""
    from ..plan.gpus import PROFILES

    capability = manifest.target.capability
    return {"archs": [f"sm_{capability}", str(capability)],
            "gpus": sorted(name for name, p in PROFILES.items() if fits_profile(manifest, p))}


def _target(target: Target) -> str:
    return target.arch + (f" ({target.gpu}, {target.sm_count} SMs)" if target.gpu else "")
