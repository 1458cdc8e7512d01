"""Real small and read-only file systems for the tests, and a way to lose root's permission bypass.

* ``tmpfs(dir, size)`` mounts a size-limited tmpfs: writes past ``size`` fail with ENOSPC, as on
  a full volume. Needs CAP_SYS_ADMIN (root here); otherwise the test is skipped and says why.
* ``read_only(src, dst)`` makes ``dst`` a read-only bind mount of ``src`` (EROFS, which root
  cannot bypass). Without CAP_SYS_ADMIN it falls back to removing write permission, which is
  real for a non-root user only; as root without mount rights it skips.
* ``without_dac()`` is a command prefix that runs a process as root but without
  CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH / CAP_FOWNER (``setpriv``), so permission bits apply to
  it as to any user. As non-root it is empty: permission bits already apply.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

DROP = "-dac_override,-dac_read_search,-fowner"


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def tmpfs(where: Path, size: int, inodes: int | None = None) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (f",nr_inodes={inodes}" if inodes else "")
    done = _mount("-t", "tmpfs", "-o", options, "tmpfs", str(where)) if shutil.which("mount") else None
    if done is None or done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() if done else 'no mount(8)'}); "
                    "the RLIMIT_FSIZE test covers a failing write instead")
    try:
        yield where
    finally:
        _umount(where)


def resize(where: Path, size: int) -> None:
    done = _mount("-o", f"remount,size={size}", str(where))
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def read_only(src: Path, dst: Path) -> Iterator[str]:
    """Yields how it was made read-only: "bind mount" or "permissions (non-root)"."""
    dst.mkdir(parents=True, exist_ok=True)
    bound = _mount("--bind", str(src), str(dst)) if shutil.which("mount") else None
    if bound is not None and bound.returncode == 0:
        try:
            done = _mount("-o", "remount,ro,bind", str(dst))
            assert done.returncode == 0, done.stderr
            yield "bind mount"
        finally:
            _umount(dst)
        return
    if os.geteuid() == 0:
        pytest.skip("root without mount rights: no way to make a directory read-only for root here")
    dst.rmdir()
    dst.symlink_to(src)
    modes = _strip_write(src)
    try:
        yield "permissions (non-root)"
    finally:
        for path, mode in modes:
            path.chmod(mode)


def _strip_write(root: Path) -> list[tuple[Path, int]]:
    modes = []
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        modes.append((path, stat.S_IMODE(mode)))
        path.chmod(stat.S_IMODE(mode) & ~0o222)
    return modes


def without_dac() -> list[str]:
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("running as root and setpriv(1) is missing: cannot make permission bits apply")
    return ["setpriv", "--bounding-set", DROP, "--inh-caps", DROP]
