"""Where a cache dir is, and where kernelcache's state lives in it, as plain strings (standard library only:
the no-op install on every pod start, cachedir/checked.py, reads the layout before anything else is imported).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing itself is not imported: this module is read on every pod start
if TYPE_CHECKING:
    from collections.abc import Iterator

STATE_DIR = ".kernelcache"
FLASHINFER_SITE_DIR = "flashinfer"  # under STATE_DIR: FlashInfer's provider registration (flashinfer_site.py)
# Under the cache dir: installed FlashInfer modules (format/manifest.py's FLASHINFER_ROOT, the members' top dir;
# the manifest sits below cachedir and cannot import this).
FLASHINFER_MODULES_DIR = "flashinfer"


def default_cache_root() -> str:
    """Where Triton looks: KERNELCACHE_HOME, else TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache."""
    for var in ("KERNELCACHE_HOME", "TRITON_CACHE_DIR"):
        if os.environ.get(var):
            return os.environ[var]
    return os.path.join(os.environ.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache")


def cache_root(cache_dir: str | os.PathLike | None) -> str:
    """The absolute cache dir (the default when None), not checked."""
    return os.path.abspath(cache_dir if cache_dir is not None else default_cache_root())


# What a killed or running install leaves under STATE_DIR: (subdir, which names). publish.sweep removes them.
SWEPT = (("journal", "*"), ("installed", ".*"), ("fingerprints", ".*"), ("checked", ".*"), ("served", ".*"))


def unfinished(state: str) -> bool:
    """Whether a killed or running install or removal left anything under ``state``: a journal, a staging dir, a
    temp file.

    Without the lock this can only say "nothing yet": an install that starts right after is the lock
    holder's business, exactly as if this check had taken the lock first."""
    return next(leftover_names(state), None) is not None


def leftover_names(state: str) -> Iterator[str]:
    """What ``unfinished`` looks for, each as ``<subdir>/<name>`` under ``state``, as it is found."""
    for name in _names(os.path.join(state, "staging")):
        yield f"staging/{name}"
    for sub, pattern in SWEPT:
        for name in _names(os.path.join(state, sub)):
            if name.startswith(".") == (pattern == ".*"):  # as glob matches them: "*" skips dot names
                yield f"{sub}/{name}"


def _names(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def kept_records(root: str, sub: str) -> list[tuple[str, float]]:
    """(path, mtime) of each ``*.json`` record under ``<root>/.kernelcache/<sub>/`` (``served``, ``checked``),
    newest first."""
    return [(path, st.st_mtime) for path, st in _records(os.path.join(root, STATE_DIR, sub))]


def keep_newest(folder: str, keep: int) -> None:
    """Remove all but the ``keep`` newest ``*.json`` records of ``folder`` (by mtime): every kept-record folder of a
    cache dir (``fingerprints``, ``checked``, ``served``) is pruned by this."""
    for stale, _ in _records(folder)[keep:]:
        try:
            os.unlink(stale)
        except FileNotFoundError:  # another process pruned it first
            continue


def _records(folder: str) -> list[tuple[str, os.stat_result]]:
    """(path, stat) of each ``*.json`` record of ``folder``, newest first; dot names (an ``atomic_write`` in progress)
    and records removed meanwhile are left out."""
    found = []
    for name in _names(folder):
        if name.endswith(".json") and not name.startswith("."):
            try:
                found.append((os.path.join(folder, name), os.stat(os.path.join(folder, name))))
            except OSError:  # removed meanwhile
                continue
    return sorted(found, key=lambda item: item[1].st_mtime_ns, reverse=True)
