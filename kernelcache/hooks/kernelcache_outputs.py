"""What Triton's tool queries print, kept by the install and handed to served processes while their files hold.

Every process that compiles or looks up a Triton kernel first runs, in subprocesses:
* ``ptxas --version``, twice: ``knobs.NvidiaTool.from_path`` (the tool's release) and ``get_ptxas_version``
  (``backend.hash()``, part of every cache key), both in https://github.com/triton-lang/triton/blob/main/python/
  triton/knobs.py and triton/backends/nvidia/compiler.py;
* ``/sbin/ldconfig -p`` (``libcuda_dirs`` in triton/backends/nvidia/driver.py), whose answer is passed on even when
  the driver's helper module comes from the cache and nothing is built;
* ``file -b <interpreter>``: ``platform_key()`` (triton/runtime/build.py, the driver's start and every helper
  module's key) calls CPython's ``platform.architecture()``, which asks ``file`` (``platform._syscmd_file``, with
  ``LC_ALL=C``) about the interpreter: 11-13 ms.
On an H200 those subprocesses cost 30 ms of a sampler's first call. Each prints what its files hold: ptxas
its own build, ldconfig the linker cache (``/etc/ld.so.cache``) it reads, in the locale's language; ``file`` the
interpreter's bytes as its magic database (the files ``file --version`` names, each also compiled as ``.mgc``)
reads them, through the libmagic the linker cache names.

So ``keep`` (the install, beside the kept ``triton_key()``) runs each once and records its output with the
(size, mtime_ns, ctime_ns) of those files (a magic file that is absent is recorded so, and must stay absent), the
variables it reads (the locale's; ``MAGIC`` for ``file``) and, for ``file``, which one the search path found. A
served process with ``KERNELCACHE_TRITON_KEYS`` set gets, in those Triton modules only, a ``subprocess`` whose
``check_output`` returns the recorded bytes for exactly such a command, and a ``platform._syscmd_file`` that
returns the recorded answer for the recorded interpreter, while every file's stat, the variables and the search
path are as recorded; otherwise the command runs. A run that wrote to stderr or failed is not kept. Standard
library only.
"""

from __future__ import annotations

import functools
import os
import sys

# json and subprocess are imported where used: sitecustomize imports this module in every served process,
# and only those that import Triton's modules need them.
RECORD = "tool-outputs.json"  # in the folder of kept Triton keys (KERNELCACHE_TRITON_KEYS)
LDCONFIG = ("/sbin/ldconfig", "-p")
LD_SO_CACHE = "/etc/ld.so.cache"  # what ldconfig -p prints (glibc's compiled-in path)
LOCALE = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")
MODULES = ("triton.knobs", "triton.backends.nvidia.compiler", "triton.backends.nvidia.driver")
FILE = "file"  # found on the search path, as platform._syscmd_file runs it
FILE_VARIABLES = ("MAGIC",)  # libmagic's database, when set (platform sets LC_ALL=C itself)
BUILD_MODULE = "triton.runtime.build"  # platform_key(): platform.architecture() is seeded once it is imported


def inputs(argv: list[str] | tuple[str, ...]) -> tuple[str, ...] | None:
    """The files whose contents decide what ``argv`` prints, for a command whose output may be kept; else None.
    (``file``'s are found by asking it: ``file_inputs``.)"""
    argv = tuple(argv)
    if len(argv) == 2 and argv[1] == "--version" and os.path.basename(argv[0]).startswith("ptxas"):
        return (argv[0],)
    if argv == LDCONFIG:
        return (LDCONFIG[0], LD_SO_CACHE)
    return None


def file_query(argv) -> bool:
    """Whether ``argv`` is the question ``platform.architecture()`` asks: ``file -b <absolute path>``."""
    return (isinstance(argv, (list, tuple)) and len(argv) == 3 and tuple(argv[:2]) == (FILE, "-b")
            and isinstance(argv[2], str) and os.path.isabs(argv[2]))


def file_command() -> list[str] | None:
    """``file -b <this interpreter>`` as ``platform.architecture()`` asks it, or None where platform has no such
    step (another interpreter than CPython's)."""
    import platform

    follow = getattr(platform, "_follow_symlinks", None)
    return [FILE, "-b", follow(sys.executable)] if follow and hasattr(platform, "_syscmd_file") else None


def triton_commands(ptxas: list[str]) -> list[list[str]]:
    """The commands to keep for Triton's ``ptxas`` binaries (paths), ldconfig where it exists, and ``file``'s
    answer about this interpreter where ``file`` is on the search path."""
    found = [[p, "--version"] for p in ptxas]
    found += [list(LDCONFIG)] if os.path.exists(LDCONFIG[0]) else []
    command = file_command()
    return found + ([command] if command and which(FILE) else [])


def which(name: str) -> str | None:
    """The real path of the executable ``name`` the search path finds first, as ``execvp`` finds it."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.realpath(path)
    return None


def file_inputs(argv: list[str]) -> tuple[str, list[str]] | None:
    """(the ``file`` the search path finds, the files its answer about ``argv[2]`` rests on), asking ``file
    --version`` which magic files it reads; None when it cannot tell. The linker cache stands for the libmagic it
    loads: installing or upgrading a library runs ldconfig, which rewrites it."""
    import subprocess

    binary = which(FILE)
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, stdin=subprocess.DEVNULL, timeout=60,
                              env=dict(os.environ, LC_ALL="C"), check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in done.stdout.decode("latin-1").splitlines() if line.startswith("magic file from ")]
    if done.returncode or len(lines) != 1:
        return None
    magic = [p for p in lines[0].removeprefix("magic file from ").split(":") if p]
    return binary, [binary, argv[2], *magic, *(p + ".mgc" for p in magic), LD_SO_CACHE]


def _stats(paths: tuple[str, ...], absent: bool = False) -> dict[str, list[int] | None] | None:
    """Each path's stamp; None when one cannot be stat-ed, unless ``absent`` (its stamp is then None)."""
    found = {}
    for path in paths:
        found[path] = _base().stamp(path)
        if found[path] is None and not absent:
            return None
    return found


def _variables(argv) -> dict[str, str]:
    """The variables ``argv``'s answer depends on, as they are now (for ``file``: the magic database's)."""
    names = FILE_VARIABLES if file_query(argv) else LOCALE
    return {k: os.environ[k] for k in names if k in os.environ}


def _run(argv: list[str]) -> dict | None:
    """Run ``argv`` once; its entry if it succeeded, wrote nothing to stderr, and its files held meanwhile."""
    run, env, more = list(argv), None, {}
    if file_query(argv):
        found = file_inputs(argv)
        if found is None:
            return None
        more["binary"], files = found
        run, env = [more["binary"], *argv[1:]], dict(os.environ, LC_ALL="C")  # as platform._syscmd_file runs it
    else:
        files = inputs(argv)
    absent = bool(more)  # file's magic files may be absent; a tool may not
    before = _stats(tuple(files), absent) if files else None
    if before is None:
        return None
    import subprocess

    try:
        done = subprocess.run(run, capture_output=True, stdin=subprocess.DEVNULL, timeout=60, check=False, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode or done.stderr or _stats(tuple(files), absent) != before:
        return None
    return {"argv": list(argv), "files": before, "locale": _variables(argv), "stdout": done.stdout.decode("latin-1"),
            **more}


def _current(entry: dict | None) -> bool:
    return bool(entry) and not _stale(entry)


def _stale(entry: dict | None) -> str:
    """Why ``entry`` does not hold now (what the debug log says); "" when it does."""
    if not entry:
        return "no kept entry for this command"
    if entry["locale"] != _variables(entry["argv"]):
        return "the variables it reads differ from the recorded ones"
    if "binary" in entry and which(entry["argv"][0]) != entry["binary"]:
        return f"the search path finds another {entry['argv'][0]} than {entry['binary']}"
    now = _stats(tuple(entry["files"]), absent=True)
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
    if not (isinstance(entry, dict) and isinstance(entry.get("argv"), list) and isinstance(entry.get("stdout"), str)
            and isinstance(entry.get("files"), dict) and isinstance(entry.get("locale"), dict)):
        return False
    if file_query(entry["argv"]):  # the files file_inputs found: its binary and the interpreter among them
        binary = entry.get("binary")
        return isinstance(binary, str) and {binary, entry["argv"][2]} <= set(entry["files"])
    return inputs(entry["argv"]) == tuple(entry["files"]) and "binary" not in entry


def keep(folder: str, commands: list[list[str]]) -> None:
    """Run each command whose kept entry no longer holds (or that has none) and record what it printed."""
    kept = load(folder)
    stale = [argv for argv in commands
             if (inputs(argv) or file_query(argv)) and not _current(kept.get(tuple(argv)))]
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

    def kept_file(self, target: str) -> str | None:
        """What ``file -b target`` printed (latin-1 text, as platform decodes it), or None: run it."""
        if self._kept is None:
            self._kept = load(self._folder)
        argv = (FILE, "-b", target)
        entry = self._kept.get(argv)
        if _current(entry):
            _say(argv, "kept output used", f"recorded in {os.path.join(self._folder, RECORD)}")
            return entry["stdout"]
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


def seed_platform(build_module, folder: str) -> None:
    """Make CPython's ``platform._syscmd_file`` (what ``platform.architecture()`` asks ``file`` with) answer from
    the kept outputs in ``folder`` while they hold; called once ``BUILD_MODULE`` (``platform_key()``) is imported."""
    import platform

    original = getattr(platform, "_syscmd_file", None)
    follow = getattr(platform, "_follow_symlinks", None)
    if original is None or follow is None or getattr(original, "kernelcache_kept", False):
        return
    outputs = kept_outputs(folder)

    def _syscmd_file(target, default=""):
        found = outputs.kept_file(follow(target)) if sys.platform.startswith("linux") else None
        if found is None:
            return original(target, default)
        return found or default  # as platform's: no output is the default

    _syscmd_file.kernelcache_kept = True
    _syscmd_file.__wrapped__ = original
    platform._syscmd_file = _syscmd_file
