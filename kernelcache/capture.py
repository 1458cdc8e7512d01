"""``kernelcache capture -- CMD``: pack whatever Triton compiled while a command ran.

For kernels outside the sampler (a short ``vllm serve`` warmup, a test suite): the command runs with
a fresh ``TRITON_CACHE_DIR`` and kernelcache's process hook on ``PYTHONPATH``
(hooks/sitecustomize.py), so every Python process it starts that imports Triton logs its
compiles -- with the signatures and constexprs Triton's own metadata lacks. The cache is then packed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .bundle.make import PackResult, pack
from .errors import BuildFailed, UsageError

SITE_DIR = Path(__file__).resolve().parent / "hooks"  # data: the process hook, not imported


def hooked_env(cache_dir: Path, compile_log: Path, base: dict | None = None) -> dict[str, str]:
    """An environment whose Python processes use ``cache_dir`` and log every compile to ``compile_log``."""
    env = dict(os.environ if base is None else base)
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    env["KERNELCACHE_COMPILE_LOG"] = str(compile_log)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def capture(command: Sequence[str], output: str | os.PathLike, keep_ir: bool = False, arch: str | None = None,
            cache_dir: str | os.PathLike | None = None) -> PackResult:
    if not command:
        raise UsageError("nothing to capture: give a command after --")
    work = Path(tempfile.mkdtemp(prefix="kernelcache-capture-"))
    cache = Path(cache_dir) if cache_dir else work / "cache"
    if cache.exists() and any(cache.iterdir()):
        raise UsageError(f"{cache} is not empty; capture needs a fresh cache dir")
    log = work / "compiles.jsonl"
    try:
        try:
            done = subprocess.run(list(command), env=hooked_env(cache, log))
        except FileNotFoundError:
            raise UsageError(f"command not found: {command[0]!r}") from None
        except (OSError, ValueError) as exc:  # a directory, not executable, an empty or NUL-holding name
            raise UsageError(f"cannot run {command[0]!r}: {getattr(exc, 'strerror', None) or exc}") from None
        if done.returncode != 0:
            raise BuildFailed(f"the captured command exited with {done.returncode}; nothing was packed")
        if not cache.exists():
            raise UsageError("the command compiled no Triton kernel (the cache dir was never created)")
        return pack(cache, output, keep_ir=keep_ir, compile_log=str(log), arch=arch)
    finally:
        shutil.rmtree(work, ignore_errors=True)
