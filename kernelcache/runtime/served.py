"""What ``env`` / ``run`` computed for a cache dir, kept so that the next pod start only checks it.

Computing the variables (runtime/env.py) reads every install receipt, hashes each installed FlashInfer module
against its manifest (2.2 MB for ``sampling``) and imports the cache dir's state modules (dataclasses,
pathlib): 70-170 ms of every pod start on 2 cores, for an answer that changes only when the cache dir, the
interpreter's packages or the caller's variables do. Once computed where the cache dir is writable and no
install left anything to finish, it is kept in ``<cache>/.kernelcache/served/<hash of its inputs>.json``:

* the inputs (their hash names the file): the cache dir, the interpreter and its ``sys.path``, the variables
  the computation reads (PYTHONPATH, HOME, FLASHINFER_DISABLE_JIT, FLASHINFER_WORKSPACE_BASE), kernelcache's
  version;
* the stamps it rested on, taken before it was computed and checked again after (a change in between keeps no
  record), each path's (inode, size, mtime_ns, ctime_ns) or null when absent: the receipts'
  directory (an install or a removal renames a receipt in or out of it), the kept Triton keys' directory,
  every file under the cache's ``flashinfer/`` (what the sha256 check vouched for: any write moves the ctime,
  which cannot be set back), every directory on ``sys.path`` (a package installed or removed there, a new
  FlashInfer version or a real ``flashinfer_jit_cache`` among them, changes its mtime; for ``python -m`` and
  ``-c`` that includes the working directory, so only the console script, whose first entry is its bin dir,
  gains from the record in a directory where files come and go) and every directory
  the variables put on PYTHONPATH;
* FlashInfer's workspace choice (runtime/workspace.py), which is decided again on every use;
* the variables.

``find_served`` answers the variables only when the cache dir is writable (a read-only one is checked the full
way), no install left anything to finish (the full way rolls it forward), every stamp holds and the workspace
choice is the same; otherwise None, and the caller computes everything again, refusing what it refuses. It
reads with the standard library's os, json, hashlib and sys alone. A record it answers from gets its mtime set
to now (one ``utime``), as a record written by the full way has it: the newest record's mtime is when the cache
dir was last served (``last_served``, which ``kernelcache ls`` shows), and ``prune`` removes records unused for
long.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from ..cachedir.layout import (
    FLASHINFER_MODULES_DIR,
    INSTALLED,
    SERVED,
    STATE_DIR,
    TRITON_KEYS,
    keep_newest,
    kept_records,
    state_path,
    unfinished,
)
from ..hooks.kernelcache_records import SAME_INODE, stamp
from ..version import __version__
from .workspace import workspace_base

FORMAT = 1
KEEP = 16
READ = ("PYTHONPATH", "HOME", "FLASHINFER_DISABLE_JIT", "FLASHINFER_WORKSPACE_BASE")


def _inputs(root: str) -> dict:
    return {"format": FORMAT, "kernelcache": __version__, "cache_dir": root, "executable": sys.executable,
            "sys_path": list(sys.path), "variables": {name: os.environ.get(name) for name in READ}}


def _record_path(root: str, inputs: dict) -> str:
    name = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]
    return state_path(root, SERVED, f"{name}.json")


def _state_paths(root: str) -> list[str]:
    """What the variables are computed from: the receipts, the kept keys, the FlashInfer files, sys.path."""
    state, modules = os.path.join(root, STATE_DIR), os.path.join(root, FLASHINFER_MODULES_DIR)
    paths = [os.path.join(state, INSTALLED), os.path.join(state, TRITON_KEYS), modules]
    for top, dirs, files in os.walk(modules):
        dirs.sort()
        paths += [os.path.join(top, name) for name in [top, *sorted(files)]]
    searched = [p or os.getcwd() for p in sys.path]  # "": the working directory (python -c)
    return [p for p in dict.fromkeys([*paths, *searched]) if p]


def _usable(root: str) -> bool:
    state = os.path.join(root, STATE_DIR)
    return os.path.isdir(state) and os.access(root, os.W_OK) and not unfinished(state)


def snapshot(root: str | os.PathLike) -> dict:
    """The stamps of what the variables are computed from, and the workspace choice, taken before computing them:
    ``remember_served`` keeps a record only if they still hold afterwards (nothing changed meanwhile). ``root``: the
    cache dir as resolved once (``cachedir.layout.cache_root``, ``CacheDir.root``), as in every function here."""
    root = os.fspath(root)
    return {"stamps": [[p, stamp(p, SAME_INODE)] for p in _state_paths(root)],
            "workspace": workspace_base(root, dict(os.environ))}


def remember_served(root: str | os.PathLike, variables: dict[str, str], before: dict) -> None:
    """Keep ``variables``, computed for the cache dir ``root`` from this process's environment after ``before``
    (``snapshot``) was taken. A cache dir that cannot take the record only loses the speed-up."""
    root = os.fspath(root)
    if not _usable(root) or snapshot(root) != before:  # not writable, or something changed while they were computed
        _say("served variables", "not kept for the next start", f"{root} is not writable, an install there is "
             "unfinished, or something changed while they were computed")
        return
    inputs = _inputs(root)
    known = {p for p, _ in before["stamps"]}
    added = [p for p in dict.fromkeys(variables.get("PYTHONPATH", "").split(os.pathsep)) if p and p not in known]
    record = {"inputs": inputs, "stamps": before["stamps"] + [[p, stamp(p, SAME_INODE)] for p in added],
              "workspace": before["workspace"], "variables": variables}
    from pathlib import Path

    from ..cachedir.publish import atomic_write  # the writer is runtime/env.py, which has these imported already

    path = Path(_record_path(root, inputs))
    try:
        path.parent.mkdir(exist_ok=True)
        atomic_write(path, json.dumps(record).encode())
        keep_newest(str(path.parent), KEEP)
    except OSError as exc:
        _say("served variables", "not kept for the next start", str(exc))
        return
    _say("served variables", "kept for the next start", str(path))


def find_served(root: str | os.PathLike) -> dict[str, str] | None:
    """The variables ``env`` computed for the cache dir ``root`` and this process's inputs, when everything they
    rested on holds now; None whenever they must be computed again. Under KERNELCACHE_DEBUG it says which, and why."""
    variables, why = _check(os.fspath(root))
    _say("kept served variables", "used" if variables is not None else "refused, computed again", why)
    return variables


def _check(root: str) -> tuple[dict[str, str] | None, str]:
    inputs = _inputs(root)
    path = _record_path(root, inputs)
    record = _read(path)
    if record is None:
        return None, f"no readable record for these inputs: {path}"
    if record.get("inputs") != inputs:
        return None, f"{path} was kept for other inputs"
    if not _usable(root):
        return None, f"{root} is not writable or an install there is unfinished"
    variables, stamps = record.get("variables"), record.get("stamps")
    if not isinstance(variables, dict) or not isinstance(stamps, list) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in variables.items()):
        return None, f"{path} is malformed"
    for kept in stamps:
        if not (isinstance(kept, list) and len(kept) == 2 and isinstance(kept[0], str)):
            return None, f"{path} is malformed"
        if stamp(kept[0], SAME_INODE) != kept[1]:
            return None, f"{kept[0]} changed since the record"
    if record.get("workspace") != workspace_base(root, dict(os.environ)):
        return None, "FlashInfer's workspace choice changed"
    try:  # noqa: SIM105 -- contextlib is one more import on every pod start
        os.utime(path)  # served now: last_served reads it
    except OSError:
        pass
    return variables, f"every stamp in {path} holds"


def _say(subject: str, outcome: str, why: str) -> None:
    """The debug log's line (hooks/kernelcache_tritonkey.say), importing nothing when it is off."""
    if os.environ.get("KERNELCACHE_DEBUG", "") not in ("", "0"):
        from ..hooks.kernelcache_tritonkey import say

        say(subject, outcome, why)


def _read(path: str) -> dict | None:
    try:
        with open(path, "rb") as handle:
            record = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _stamps_hold(stamps: object) -> bool:
    return isinstance(stamps, list) and all(
        isinstance(s, list) and len(s) == 2 and isinstance(s[0], str) and stamp(s[0], SAME_INODE) == s[1]
        for s in stamps)


# -- for cache management (kernelcache ls / prune) --------------------------------------------------


def last_served(root: str | os.PathLike) -> float | None:
    """When ``env``, ``run`` or ``activate()`` last served the cache dir ``root`` (where it was writable): the
    newest record's mtime. None when none is kept."""
    found = kept_records(os.fspath(root), SERVED)
    return found[0][1] if found else None


def record_holds(path: str) -> bool:
    """Whether the record at ``path`` could answer again: it reads, is of this format and kernelcache version,
    and every stamp still holds. The stamp of a path that exists holds its ctime, which never goes back: once it
    changed, the record is never used again."""
    record = _read(path)
    inputs = record.get("inputs") if record is not None else None
    return (isinstance(inputs, dict) and inputs.get("format") == FORMAT and inputs.get("kernelcache") == __version__
            and _stamps_hold(record.get("stamps")))
