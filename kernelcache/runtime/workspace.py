"""Where FlashInfer may write its log and lock files when $HOME cannot take them (standard library only:
the pod-start fast path, runtime/served.py, decides it again on every start).

FlashInfer creates ``<FLASHINFER_WORKSPACE_BASE or $HOME>/.cache/flashinfer/...`` when it is imported and
fails there when that is read-only, which is common in pods
(https://github.com/flashinfer-ai/flashinfer/blob/main/flashinfer/jit/env.py). An explicit setting is never
changed.
"""

from __future__ import annotations

import os

from ..cachedir.layout import FLASHINFER_SITE_DIR, STATE_DIR


def workspace_base(root: str | os.PathLike, base: dict[str, str]) -> str | None:
    """A writable ``FLASHINFER_WORKSPACE_BASE`` for a process with environment ``base``; None: leave it unset."""
    if "FLASHINFER_WORKSPACE_BASE" in base:
        return None
    home = base.get("HOME") or os.path.expanduser("~")
    if writable(os.path.join(home, ".cache", "flashinfer")):
        return None
    candidate = os.path.join(os.fspath(root), STATE_DIR, FLASHINFER_SITE_DIR, "workspace")
    if writable(candidate):
        return candidate
    import tempfile  # only here: its imports cost a pod start ~5 ms

    candidate = os.path.join(tempfile.gettempdir(), f"kernelcache-flashinfer-{os.getuid()}")
    return candidate if writable(candidate) else None


def writable(path: str) -> bool:
    """Whether ``path`` exists as a writable dir or could be created (its nearest existing parent is)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
