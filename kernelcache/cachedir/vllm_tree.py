"""A bundle's vLLM compile trees in a cache dir: the AOT directories each places under ``<cache dir>/vllm``
(``VLLM_CACHE_ROOT`` of a served process; enginecompile.py builds the trees).

An install unpacks each tree in its staging dir (``stage``) and publishes the AOT directories as entries of the
bundle, each whole in one rename, with its other entries and before its receipt (install.py): a kill leaves no
receipt without its tree, only a journal that the next command rolls forward. ``absent`` names what a receipt's
bundle lacks under ``vllm/`` (an install cut short before this order, a directory removed by hand), so that
``installed_complete`` answers no and a re-install puts it back.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from ..errors import EntryError
from ..format.manifest import ENGINE_FILES
from .layout import VLLM_DIR

if TYPE_CHECKING:
    from ..format.manifest import Manifest

AOT_ROOT = ("torch_compile_cache", "torch_aot_compile")  # under VLLM_CACHE_ROOT: one AOT directory per hash


def trees(manifest: Manifest) -> list[str]:
    """The bundle's compile trees (``vllm-compile/<sha16>/torch_compile_cache.tar``), relative to the cache dir."""
    engine = manifest.engine
    return sorted(f.path for f in engine.files if f.path.endswith("/" + ENGINE_FILES[1])) if engine else []


def _aot_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The tree's members in an AOT directory (``torch_compile_cache/torch_aot_compile/<hash>``, itself included)."""
    return [m for m in tar.getmembers() if _aot_head(m.name) is not None]


def _aot_head(name: str) -> str | None:
    parts = PurePosixPath(name).parts
    if len(parts) < 3 or parts[:2] != AOT_ROOT or parts[2] == "..":
        return None
    return "/".join(parts[:3])


def aot_dirs(tree: Path) -> list[str]:
    """The AOT directories a tree holds (``torch_compile_cache/torch_aot_compile/<hash>``, relative to
    ``VLLM_CACHE_ROOT``): what an install places, each whole."""
    with tarfile.open(tree) as tar:
        return sorted({head for name in tar.getnames() if (head := _aot_head(name)) is not None})


def stage(staging: Path, manifest: Manifest) -> list[str]:
    """Unpack each tree the bundle's extraction put in ``staging`` to ``staging/vllm``; the AOT directories, relative
    to the cache dir (``vllm/torch_compile_cache/torch_aot_compile/<hash>``): entries to publish with the rest."""
    found: set[str] = set()
    for tree in trees(manifest):
        try:
            with tarfile.open(staging / tree) as tar:
                members = _aot_members(tar)
                tar.extractall(staging / VLLM_DIR, members=members, filter="data")
        except tarfile.TarError as exc:  # the data filter's refusals too (a link or a path out of the tree)
            raise EntryError(f"{tree}: vLLM's compile tree cannot be unpacked: {exc}") from None
        found.update(f"{VLLM_DIR}/{_aot_head(m.name)}" for m in members)  # the tree read once
    return sorted(found)


def installed_dirs(cache_dir: Path, manifest: Manifest) -> list[str]:
    """The AOT directories a bundle's installed trees place, relative to the cache dir (a tree that is gone names
    none). ``rm`` and ``prune`` remove these with the bundle: a receipt written before installs published them as
    entries lists only the bundle's members."""
    found: set[str] = set()
    for tree in trees(manifest):
        with contextlib.suppress(OSError, tarfile.TarError):
            found.update(f"{VLLM_DIR}/{rel}" for rel in aot_dirs(cache_dir / tree))
    return sorted(found)


def absent(cache_dir: Path, manifest: Manifest) -> list[str]:
    """The files of the bundle's installed trees' AOT directories that are not under ``<cache_dir>/vllm``, relative
    to the cache dir (a tree that is gone names none: the manifest's own files say that)."""
    missing = []
    for tree in trees(manifest):
        with contextlib.suppress(OSError, tarfile.TarError), tarfile.open(cache_dir / tree) as tar:
            names = [f"{VLLM_DIR}/{m.name}" for m in _aot_members(tar) if m.isfile()]
            missing += [name for name in names if not os.path.exists(cache_dir / name)]
    return sorted(set(missing))


def aot_entry(entry: Path) -> bool:
    """Whether ``entry`` is an AOT directory's place in a cache dir (``<cache>/vllm/torch_compile_cache/
    torch_aot_compile/<hash>``)."""
    return entry.parent.parts[-3:] == (VLLM_DIR, *AOT_ROOT)
