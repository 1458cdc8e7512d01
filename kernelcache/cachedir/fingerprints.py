"""Environment fingerprints computed before, kept in the cache dir they were checked for.

``<cache>/.kernelcache/fingerprints/<key digest>.json`` holds one ``KnownEnvironment``: the
fingerprint and the full ``EnvironmentKey`` it was computed under. A record is used only when its
stored key equals the key computed now, field by field (the file name is only where to look), so
an upgraded Triton, another interpreter, another ptxas or another variable always recomputes.

Records are written only into a state dir that exists (an install that is refused creates nothing)
and are not covered by the lock: each is one atomic rename, and two writers write the same bytes.
A record that cannot be read is ignored; the newest ``KEEP`` are kept.

``<cache>/.kernelcache/triton-keys/`` keeps, beside them, the ``triton_key()`` value itself, which a served
process takes instead of hashing libtriton.so again while Triton's files are unchanged
(hooks/kernelcache_tritonkey.py, the only reader), and what Triton's tool queries (``ptxas --version``,
``ldconfig -p``) print, which served processes take instead of running them while their files hold
(hooks/kernelcache_outputs.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from ..format.envkey import EnvironmentKey, KnownEnvironment
from ..format.envscan import package_dir
from ..hooks import kernelcache_outputs, kernelcache_tritonkey
from .layout import FINGERPRINTS, keep_newest
from .publish import atomic_write
from .state import CacheDir

KEEP = 16


def _folder(cache: CacheDir) -> Path:
    return cache.state / FINGERPRINTS


def load_fingerprint(cache: CacheDir, key: EnvironmentKey) -> KnownEnvironment | None:
    """The record computed under ``key`` in this cache dir, or None (none, unreadable, another key)."""
    try:
        known = KnownEnvironment.from_json((_folder(cache) / f"{key.digest}.json").read_bytes())
    except (OSError, ValueError):
        return None
    return known if known.key == key else None


def save_fingerprint(cache: CacheDir, known: KnownEnvironment) -> None:
    """Keep ``known`` for the next command; a cache dir that cannot take it only loses the speed-up."""
    if not cache.state.is_dir():
        return
    folder = _folder(cache)
    with contextlib.suppress(OSError):
        folder.mkdir(exist_ok=True)
        atomic_write(folder / f"{known.key.digest}.json", known.to_json().encode())
        keep_newest(os.fspath(folder), KEEP)


def save_triton_key(cache: CacheDir, key: EnvironmentKey, known: str | None = None) -> None:
    """Keep ``triton_key()`` for served processes: ``known``, the value a bundle's identity record gave for
    this Triton (format/identity.py), or else the one this process computed under ``key``.

    Only after a fingerprint was taken (Triton imported and its key cached in-process, or its files matched
    the record) and only for the Triton directory ``key`` stat-ed; the files' stats come from ``key``, taken
    before."""
    module = sys.modules.get("triton.runtime.cache")
    if not key.triton or not cache.state.is_dir() or (module is None and known is None):
        return
    root = kernelcache_tritonkey.triton_root(module) if known is None else package_dir("triton")
    files = {rel: list(stat) for rel, stat in key.triton.items()}
    if root is None or files != kernelcache_tritonkey.triton_files(root):
        return  # another Triton than the key's, or one that changed since
    with contextlib.suppress(OSError):
        value = known if known is not None else module.triton_key()
        kernelcache_tritonkey.save_key(os.fspath(cache.triton_keys), root, value, files)
        kernelcache_outputs.keep(os.fspath(cache.triton_keys), kernelcache_outputs.triton_commands(list(key.ptxas)))


def seed_triton_key(cache: CacheDir) -> None:
    """Let this process take the ``triton_key()`` an earlier install kept in ``cache``, when Triton's files
    still hold it (by stat, or by content: an image unpacked on another node), instead of hashing
    libtriton.so again. Imports Triton: only for a fingerprint that must be computed anyway."""
    if not cache.triton_keys.is_dir():
        return
    try:
        import triton.runtime.cache as module
    except ImportError:
        return  # the fingerprint's own import says what is missing
    kernelcache_tritonkey.seed(module, os.fspath(cache.triton_keys))
