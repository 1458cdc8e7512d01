"""The state lock: taken with flock at once when free (no filelock import), else waited for with filelock; the
two kinds exclude each other, so installs by this and by older kernelcache versions never overlap."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from helpers.common import ROOT

from kernelcache.cachedir import CacheDir
from kernelcache.errors import StorageError

pytestmark = pytest.mark.fast


def holder(code: str, ready) -> subprocess.Popen:
    """A process that takes the lock with ``code``, touches ``ready`` and holds it until its stdin closes."""
    script = textwrap.dedent(code) + f"\nopen({str(ready)!r}, 'w').close()\nimport sys\nsys.stdin.read()\n"
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the holder did not take the lock"
        time.sleep(0.02)
    return proc


def test_a_free_lock_is_taken_without_importing_filelock(tmp_path):
    code = f"""
        import sys
        from kernelcache.cachedir import CacheDir
        cache = CacheDir.at({str(tmp_path)!r})
        cache.ensure_state()
        with cache.locked():
            pass
        with cache.locked():  # released: taken again
            assert "filelock" not in sys.modules
        print("ok")
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr
    assert (tmp_path / ".kernelcache" / "lock").is_file()  # stays, as filelock leaves it: waiters share the inode


def test_a_lock_held_with_filelock_is_waited_for_and_times_out(tmp_path, monkeypatch):
    cache = CacheDir(tmp_path)
    cache.ensure_state()
    code = f"import filelock\nheld = filelock.FileLock({str(cache.state / 'lock')!r})\nheld.acquire()"
    proc = holder(code, tmp_path / "ready")
    try:
        monkeypatch.setenv("KERNELCACHE_LOCK_TIMEOUT", "0.3")
        started = time.monotonic()
        with pytest.raises(StorageError, match="timed out after 0s waiting for the lock"), cache.locked():
            pass
        assert time.monotonic() - started >= 0.3
    finally:
        proc.communicate("")
    with cache.locked():  # the holder is gone: free again
        pass


def test_filelock_waits_for_a_lock_taken_at_once(tmp_path):
    cache = CacheDir(tmp_path)
    cache.ensure_state()
    code = f"""
        from kernelcache.cachedir import CacheDir
        lock = CacheDir.at({str(tmp_path)!r}).locked()
        lock.__enter__()
    """
    proc = holder(code, tmp_path / "ready")
    try:
        import filelock

        with pytest.raises(filelock.Timeout):
            filelock.FileLock(str(cache.state / "lock"), timeout=0.3).acquire()
    finally:
        proc.communicate("")
    lock = filelock.FileLock(str(cache.state / "lock"), timeout=5)
    lock.acquire()
    lock.release()
