"""Read-only base + writable overlay: the environment that makes Triton use ``kernelcache_overlay``.

``kernelcache env --read-only`` / ``kernelcache run --read-only`` call ``overlay_environment``. The
base is an installed cache that cannot be written (an image layer, an OCI image volume, a
read-only PVC); it is checked, never changed. The overlay is a writable dir (an emptyDir) where
the misses are compiled, and the miss log lists them for ``kernelcache build --from-misses``.
The manager itself is ``hooks/kernelcache_overlay.py``, which the served interpreter
imports from ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..cachedir import STATE_DIR, CacheDir
from ..cachedir.layout import MISS_LOG
from ..errors import BaseUnusable, StorageError, UsageError
from ..hooks import kernelcache_autotune, kernelcache_tritonkey

SITE_DIR = Path(__file__).resolve().parents[1] / "hooks"
MANAGER = "kernelcache_overlay:OverlayCacheManager"
OVERLAY_ENV = "KERNELCACHE_OVERLAY"


@dataclass(frozen=True)
class Overlay:
    base: CacheDir  # the read-only installed cache
    overlay: Path
    miss_log: Path
    bundles: int  # complete installed bundles found in the base

    def environment(self) -> dict[str, str]:
        path = [str(SITE_DIR), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        return {
            "TRITON_CACHE_DIR": str(self.overlay),
            "TRITON_CACHE_MANAGER": MANAGER,
            "KERNELCACHE_BASE_DIR": str(self.base.root),
            "KERNELCACHE_MISS_LOG": str(self.miss_log),
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
            **self._triton_keys(),
            **self._choices(),
            **self._engine(),
        }

    def _engine(self) -> dict[str, str]:
        """vLLM's compile artifacts of the base, if any (enginecompile.py ``read_only_environment``)."""
        from ..enginecompile import read_only_environment

        return read_only_environment(self.base.root, self.overlay)

    def _choices(self) -> dict[str, str]:
        """Triton's autotune cache on, guarded, if a bundle installed in the base put autotune choices there."""
        return kernelcache_autotune.environment() if self.base.choices_installed() else {}

    def _triton_keys(self) -> dict[str, str]:
        """The base's kept ``triton_key()`` values (hooks/kernelcache_tritonkey.py), if it has any."""
        folder = self.base.triton_keys
        return {kernelcache_tritonkey.ENV_VAR: str(folder)} if folder.is_dir() else {}


def default_overlay() -> Path:
    return Path(os.environ.get(OVERLAY_ENV) or Path(tempfile.gettempdir()) / "kernelcache-overlay")


def prepare_overlay(base: CacheDir, overlay: str | os.PathLike | None = None,
                    miss_log: str | os.PathLike | None = None) -> Overlay:
    """Check the base (read only), create the overlay, and return the set-up."""
    root = base.root
    top = Path(os.path.abspath(overlay)) if overlay is not None else default_overlay()
    if top == root:
        raise UsageError(f"the overlay must not be the read-only base ({root})")
    bundles = check_base(base)
    log = Path(os.path.abspath(miss_log)) if miss_log is not None else top / STATE_DIR / MISS_LOG
    _writable(top)
    _writable(log.parent)
    return Overlay(base, top, log, bundles)


def overlay_environment(base: CacheDir, overlay: str | os.PathLike | None = None,
                        miss_log: str | os.PathLike | None = None) -> dict[str, str]:
    return prepare_overlay(base, overlay, miss_log).environment()


def check_base(cache: CacheDir) -> int:
    """Refuse a base that would miss: absent, half-installed, or missing files its receipts list."""
    root = cache.root
    if not root.is_dir():
        raise BaseUnusable(f"read-only base {root} is not a directory")
    if cache.pending_journals():
        raise BaseUnusable(f"read-only base {root} holds an unfinished install; run `kernelcache install` "
                           "into it while it is still writable")
    scan = cache.scan()
    if scan.bad:  # it cannot be replaced here: the base is read-only
        path, why = scan.bad[0]
        raise BaseUnusable(f"read-only base {root}: install receipt {path.name} is unreadable ({why}); reinstall "
                           "into it while it is still writable")
    for receipt in scan.receipts:
        if not cache.installed_complete(receipt.digest, receipt.manifest, receipt.choices):
            raise BaseUnusable(f"read-only base {root} lacks files of bundle {receipt.digest[:16]}")
    return len(scan.receipts)


def _writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".kernelcache-probe-"):
            pass
    except OSError as exc:
        raise StorageError(f"overlay {path} is not writable: {exc.strerror or exc}") from None
