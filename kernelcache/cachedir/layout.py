"""Where a cache dir is, and where kernelcache's state lives in it, as plain strings (standard library only:
the no-op install on every pod start, cachedir/checked.py, reads the layout before anything else is imported).
"""

from __future__ import annotations

import os

STATE_DIR = ".kernelcache"


def default_cache_root() -> str:
    """Where Triton looks: KERNELCACHE_HOME, else TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache."""
    for var in ("KERNELCACHE_HOME", "TRITON_CACHE_DIR"):
        if os.environ.get(var):
            return os.environ[var]
    return os.path.join(os.environ.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache")


def cache_root(cache_dir: str | os.PathLike | None) -> str:
    """The absolute cache dir (the default when None), not checked."""
    return os.path.abspath(cache_dir if cache_dir is not None else default_cache_root())
