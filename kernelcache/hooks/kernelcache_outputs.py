"""What Triton's tool queries print, kept by the install and handed to served processes while their files hold.

Every process that compiles or looks up a Triton kernel first runs, in subprocesses:
* ``ptxas --version``, twice: ``knobs.NvidiaTool.from_path`` (the tool's release) and ``get_ptxas_version``
  (``backend.hash()``, part of every cache key), both in https://github.com/triton-lang/triton/blob/main/python/
  triton/knobs.py and triton/backends/nvidia/compiler.py;
* ``/sbin/ldconfig -p`` (``libcuda_dirs`` in triton/backends/nvidia/driver.py), whose answer is passed on even when
  the driver's helper module comes from the cache and nothing is built.
On an H200 those subprocesses cost 17-20 ms of a sampler's first call. Each prints what its files hold: ptxas
its own build, ldconfig the linker cache (``/etc/ld.so.cache``) it reads, in the locale's language.

So ``keep`` (the install, beside the kept ``triton_key()``) runs each once and records its output with the
(size, mtime_ns, ctime_ns) of those files and the locale variables. A served process with
``KERNELCACHE_TRITON_KEYS`` set gets, in those Triton modules only, a ``subprocess`` whose ``check_output``
returns the recorded bytes for exactly such a command while every file's stat and the locale are as recorded,
and runs the command otherwise. A run that wrote to stderr or failed is not kept. Standard library only.
"""

from __future__ import annotations

import functools
import os

# json and subprocess are imported where used: sitecustomize imports this module in every served process,
# and only those that import Triton's modules need them.
RECORD = "tool-outputs.json"  # in the folder of kept Triton keys (KERNELCACHE_TRITON_KEYS)
LDCONFIG = ("/sbin/ldconfig", "-p")
LD_SO_CACHE = "/etc/ld.so.cache"  # what ldconfig -p prints (glibc's compiled-in path)
LOCALE = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")
MODULES = ("triton.knobs", "triton.backends.nvidia.compiler", "triton.backends.nvidia.driver")


def inputs(argv: list[str] | tuple[str, ...]) -> tuple[str, ...] | None:
    """The files whose contents decide what ``argv`` prints, for a command whose output may be kept; else None."""
    argv = tuple(argv)
    if len(argv) == 2 and argv[1] == "--version" and os.path.basename(argv[0]).startswith("ptxas"):
        return (argv[0],)
    if argv == LDCONFIG:
        return (LDCONFIG[0], LD_SO_CACHE)
    return None


def triton_commands(ptxas: list[str]) -> list[list[str]]:
    """The commands to keep for Triton's ``ptxas`` binaries (paths), and ldconfig where it exists."""
    found = [[p, "--version"] for p in ptxas]
    return found + ([list(LDCONFIG)] if os.path.exists(LDCONFIG[0]) else [])


def _stats(paths: tuple[str, ...]) -> dict[str, list[int]] | None:
    found = {}
    for path in paths:
        found[path] = _base().stamp(path)
        if found[path] is None:
            return None
    return found


def _locale() -> dict[str, str]:
    return {k: os.environ[k] for k in LOCALE if k in os.environ}


def _run(argv: list[str]) -> dict | None:
    """Run ``argv`` once; its entry if it succeeded, wrote nothing to stderr, and its files held meanwhile."""
    files = inputs(argv)
    before = _stats(files) if files else None
    if before is None:
        return None
    import subprocess

    try:
        done = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode or done.stderr or _stats(files) != before:
        return None
    return {"argv": list(argv), "files": before, "locale": _locale(), "stdout": done.stdout.decode("latin-1")}


def _current(entry: dict | None) -> bool:
    return bool(entry) and entry["locale"] == _locale() and _stats(tuple(entry["files"])) == entry["files"]


def _stale(entry: dict | None) -> str:
    """Why ``entry`` does not hold now (what the debug log says); "" when it does."""
    if not entry:
        return "no kept entry for this command"
    if entry["locale"] != _locale():
        return "the locale variables differ from the recorded ones"
    now = _stats(tuple(entry["files"])) or {}
    changed = [path for path, stat in entry["files"].items() if now.get(path) != stat]
    return f"{changed[0]} is not the recorded file (size, mtime, ctime)" if changed else ""


def load(folder: str) -> dict[tuple[str, ...], dict]:
    """The kept entries by command; an unreadable or malformed record keeps nothing."""
    import json

    try:
        with open(os.path.join(folder, RECORD), encoding="utf-8") as f:
            entries = json.load(f)["outputs"]
        return {tuple(e["argv"]): e for e in entries if _well_formed(e)}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _well_formed(entry) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("argv"), list) and isinstance(entry.get("stdout"), str)
            and isinstance(entry.get("files"), dict) and isinstance(entry.get("locale"), dict)
            and inputs(entry["argv"]) == tuple(entry["files"]))


def keep(folder: str, commands: list[list[str]]) -> None:
    """Run each command whose kept entry no longer holds (or that has none) and record what it printed."""
    kept = load(folder)
    stale = [argv for argv in commands if inputs(argv) and not _current(kept.get(tuple(argv)))]
    if not stale:
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(stale)) as pool:  # each waits on its child: ~2 ms for all instead of ~2 ms each
        entries = list(pool.map(_run, stale))
    for argv, entry in zip(stale, entries):
        if entry is None:
            kept.pop(tuple(argv), None)
        else:
            kept[tuple(argv)] = entry
    _write(folder, {"outputs": list(kept.values())})


def _write(folder: str, record: dict) -> None:
    _base().write_json(os.path.join(folder, RECORD), record)


def _base():
    """The sibling ``kernelcache_tritonkey``, whichever way this module was imported."""
    try:
        from . import kernelcache_tritonkey  # imported as kernelcache.hooks.kernelcache_outputs
    except ImportError:
        import kernelcache_tritonkey  # imported from the served site dir
    return kernelcache_tritonkey


def _say(argv: tuple, outcome: str, why: str) -> None:
    base = _base()
    if base.debugging():
        base.say(f"`{' '.join(map(str, argv))}`", outcome, why)


class KeptOutputs:
    """``subprocess`` for a Triton module: ``check_output`` of a kept command whose entry holds returns its
    recorded output; everything else is the real module's."""

    def __init__(self, folder: str):
        self._folder = folder
        self._kept: dict[tuple[str, ...], dict] | None = None

    def __getattr__(self, name):
        import subprocess

        return getattr(subprocess, name)

    def check_output(self, *args, **kwargs):
        import subprocess

        out = self.kept_output(args, kwargs)
        return out if out is not None else subprocess.check_output(*args, **kwargs)

    def kept_output(self, args: tuple, kwargs: dict) -> bytes | None:
        """The recorded bytes for ``check_output(*args, **kwargs)`` (bytes out; stderr kept empty), or None."""
        if len(args) != 1 or not set(kwargs) <= {"stderr"} or not isinstance(args[0], (list, tuple)):
            return None
        if self._kept is None:
            self._kept = load(self._folder)
        argv = tuple(args[0])
        entry = self._kept.get(argv)
        if entry is None and argv and isinstance(argv[0], str):  # the install names each file by its real path
            entry = self._kept.get((os.path.realpath(argv[0]), *argv[1:]))
        if _current(entry):
            _say(argv, "kept output used", f"recorded in {os.path.join(self._folder, RECORD)}")
            return entry["stdout"].encode("latin-1")
        _say(argv, "refused the kept output, the command runs", _stale(entry))
        return None


@functools.cache
def kept_outputs(folder: str) -> KeptOutputs:
    """One instance per folder, shared by the modules it is given to (the record is read once)."""
    return KeptOutputs(folder)


def seed(module, folder: str) -> None:
    """Give ``module`` (one of ``MODULES``) the kept outputs in ``folder``, unless it already has some."""
    if not isinstance(getattr(module, "subprocess", None), KeptOutputs):
        module.subprocess = kept_outputs(folder)
