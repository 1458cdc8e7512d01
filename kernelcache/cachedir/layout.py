"""Where a cache dir is, and where kernelcache's state lives in it, as plain strings (standard library only:
the no-op install on every pod start, cachedir/checked.py, reads the layout before anything else is imported).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing itself is not imported: this module is read on every pod start
if TYPE_CHECKING:
    from collections.abc import Iterator

# The layout of a cache dir: every name kernelcache keeps in one, and nowhere else spelled (cachedir/__init__.py
# says what each holds). Under the cache dir:
STATE_DIR = ".kernelcache"  # kernelcache's state; Triton's cache keys stand beside it
# Installed FlashInfer modules (format/manifest.py's FLASHINFER_ROOT, the members' top dir; the manifest sits below
# cachedir and cannot import this).
FLASHINFER_MODULES_DIR = "flashinfer"
VLLM_DIR = "vllm"  # vLLM's compile artifacts, unpacked: VLLM_CACHE_ROOT of a served process (enginecompile.py)
# Under STATE_DIR:
LOCK = "lock"  # the file lock every writer of the state holds
INSTALLED = "installed"  # <digest>.json: one receipt per installed bundle
JOURNAL = "journal"  # <digest>.json: an install being published; <digest>.rm.json: a removal
STAGING = "staging"  # bundles being extracted, on the cache dir's filesystem
FINGERPRINTS = "fingerprints"  # <key digest>.json: environment fingerprints computed here (fingerprints.py)
CHECKED = "checked"  # <hash of a bundle path>.json: what an accepted install was checked against (checked.py)
SERVED = "served"  # <hash of its inputs>.json: the variables env / run computed (runtime/served.py)
TRITON_KEYS = "triton-keys"  # kept triton_key() values (fingerprints.py writes, hooks/kernelcache_tritonkey reads)
FLASHINFER_SITE_DIR = "flashinfer"  # site-<digest>/: FlashInfer's provider registration (flashinfer_site.py)
SITE_PREFIX = "site-"  # under FLASHINFER_SITE_DIR: one site dir per set of installed modules
MISS_LOG = "misses.jsonl"  # under an overlay's STATE_DIR: the misses a read-only base served (runtime/overlay.py)
LOG = "log.jsonl"  # one line per finished install
SKELETON = (STAGING, INSTALLED, JOURNAL)  # what every install makes first (and a refused one removes again)


def state_path(root: str, *names: str) -> str:
    """``<root>/.kernelcache/<names...>``: a path in the state of the cache dir ``root``."""
    return os.path.join(root, STATE_DIR, *names)


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
SWEPT = ((JOURNAL, "*"), (INSTALLED, ".*"), (FINGERPRINTS, ".*"), (CHECKED, ".*"), (SERVED, ".*"))


def unfinished(state: str) -> bool:
    """Whether a killed or running install or removal left anything under ``state``: a journal, a staging dir, a
    temp file.

    Without the lock this can only say "nothing yet": an install that starts right after is the lock
    holder's business, exactly as if this check had taken the lock first."""
    return next(leftover_names(state), None) is not None


def leftover_names(state: str) -> Iterator[str]:
    """What ``unfinished`` looks for, each as ``<subdir>/<name>`` under ``state``, as it is found."""
    for name in _names(os.path.join(state, STAGING)):
        yield f"{STAGING}/{name}"
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
    return [(path, st.st_mtime) for path, st in _records(state_path(root, sub))]


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
