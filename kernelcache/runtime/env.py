"""Point Triton (and FlashInfer) at an installed cache: shell exports, exec, or in-process.

Everything is carried by environment variables, so it reaches vLLM's engine and worker
processes: vLLM keeps a ``TRITON_CACHE_DIR`` that is set before it starts (vllm-sampler.md §4).
When the cache holds FlashInfer modules, runtime/flashinfer.py adds PYTHONPATH (its provider
registration) and ``FLASHINFER_DISABLE_JIT=1``.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import AlreadyActivated, ReadOnlyCache, UsageError
from ..install import InstallResult, install, receipts, recover, resolve_cache_dir
from . import flashinfer


def environment(cache_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """The variables that make Triton and FlashInfer use the installed cache at ``cache_dir``."""
    root = resolve_cache_dir(cache_dir)
    variables = {"TRITON_CACHE_DIR": str(root)}
    variables.update(flashinfer.environment(root))
    return variables


def shell_exports(variables: dict[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())


def prepare(bundle: str | os.PathLike | None, cache_dir: str | os.PathLike | None, force: bool = False
            ) -> tuple[InstallResult | None, dict[str, str]]:
    """Install ``bundle`` if given (a no-op when already there), finish interrupted installs."""
    result = install(bundle, cache_dir, force=force) if bundle is not None else None
    root = result.cache_dir if result else resolve_cache_dir(cache_dir)
    check_read_only(root)
    if root.is_dir() and os.access(root, os.W_OK):
        recover(root)
    return result, environment(root)


def check_read_only(root: Path) -> None:
    """A read-only cache dir without the overlay: refuse it when every kernel would miss, else warn.

    Triton's ``FileCacheManager`` creates the directory of a key it does not find, so a key the cache
    lacks raises ``OSError: [Errno 30] Read-only file system`` inside the engine instead of compiling
    (https://github.com/triton-lang/triton/blob/main/python/triton/runtime/cache.py). A cache installed
    at another path than the one it is served from misses every kernel, since its group files name
    the install path: refused. Served where it was installed, it hits whatever the bundle holds: a
    warning. ``--read-only`` serves either through an overlay that writes misses elsewhere.
    """
    if not root.is_dir() or os.access(root, os.W_OK):
        return
    here = os.path.realpath(root)
    elsewhere = sorted({r["cache_dir"] for r in receipts(root)
                        if isinstance(r.get("cache_dir"), str) and os.path.realpath(r["cache_dir"]) != here})
    if elsewhere:
        raise ReadOnlyCache(
            f"{root} is read-only and was installed at {elsewhere[0]}: Triton would miss every kernel and crash "
            "the engine on the first miss (EROFS); use --read-only to serve it with a writable overlay for misses"
        )
    print(f"kernelcache: warning: {root} is read-only: a kernel the bundle lacks would crash the engine (EROFS) "
          "instead of compiling; --read-only serves it with a writable overlay for misses", file=sys.stderr)


def activate(bundle_or_dir: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
             force: bool = False) -> dict[str, str]:
    """Use a bundle (installed first) or an installed cache dir in this process and its children.

    Call it before importing triton or vllm. Raises ``AlreadyActivated`` when Triton's cache dir
    was already pinned in this process to somewhere else.
    """
    bundle = None
    if bundle_or_dir is not None and Path(bundle_or_dir).is_file():
        bundle = bundle_or_dir
    elif bundle_or_dir is not None:
        if cache_dir is not None:
            raise UsageError("give either an installed cache dir or --cache-dir, not both")
        cache_dir = bundle_or_dir
    _, variables = prepare(bundle, cache_dir, force)
    _refuse_if_pinned(variables["TRITON_CACHE_DIR"])
    if "PYTHONPATH" in variables:
        _refuse_if_flashinfer_loaded()
    os.environ.update(variables)
    _extend_sys_path(variables.get("PYTHONPATH", ""))
    return variables


def run(command: Sequence[str], bundle: str | os.PathLike | None = None,
        cache_dir: str | os.PathLike | None = None, force: bool = False) -> None:
    """Install if needed, then replace this process with ``command`` in the cache's environment."""
    if not command:
        raise UsageError("nothing to run: give a command after --")
    _, variables = prepare(bundle, cache_dir, force)
    exec_command(command, variables)


def exec_command(command: Sequence[str], variables: dict[str, str]) -> None:
    """Replace this process with ``command``, its environment updated with ``variables``."""
    if not command:
        raise UsageError("nothing to run: give a command after --")
    env = {**os.environ, **variables}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), env)
    except FileNotFoundError:
        raise UsageError(f"command not found: {command[0]!r}") from None
    except (OSError, ValueError) as exc:  # a directory, not executable, an empty or NUL-holding name
        raise UsageError(f"cannot run {command[0]!r}: {getattr(exc, 'strerror', None) or exc}") from None


def _extend_sys_path(pythonpath: str) -> None:
    """PYTHONPATH reaches child processes; this process needs the same entries in sys.path."""
    import importlib

    new = [p for p in pythonpath.split(os.pathsep) if p and p not in sys.path]
    sys.path[0:0] = new
    if new:
        importlib.invalidate_caches()


def _refuse_if_flashinfer_loaded() -> None:
    if "flashinfer.jit.env" in sys.modules:
        raise AlreadyActivated(
            "flashinfer is already imported in this process and has fixed its prebuilt-module providers; "
            "call kernelcache.activate() before importing flashinfer or vllm"
        )


def _refuse_if_pinned(wanted: str) -> None:
    knobs = sys.modules.get("triton.knobs")
    if knobs is None:
        return
    pinned = knobs.cache.__dict__.get("dir")
    if pinned is not None and os.path.abspath(pinned) != os.path.abspath(wanted):
        raise AlreadyActivated(
            f"triton.knobs.cache.dir is already set to {pinned} in this process; call "
            "kernelcache.activate() before anything configures Triton"
        )
