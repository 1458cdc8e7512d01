"""Disk full, permission denied, read-only target: a clean error, exit 40, and the cache as it was.

Disk full is a real size-limited tmpfs (tests/helpers/mounts.py), at several sizes below what the bundle
needs, and one with too few inodes. A write failing midway is also shown without any mount, with
RLIMIT_FSIZE in the child (EFBIG, "File too large": a per-file cap, so a stand-in for a failing
write rather than for a full volume). Permission denied is real: root without its DAC capabilities
(``setpriv``) or any non-root user. Read-only is a read-only bind mount.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.cachecheck import bundle_state, expected_bytes, leftovers
from helpers.common import ROOT, clean_env, kc, tree
from helpers.mounts import read_only, resize, tmpfs, without_dac

from kernelcache.cachedir import STATE_DIR
from kernelcache.cli import main
from kernelcache.errors import ReadOnlyCache, StorageError
from kernelcache.format import archive
from kernelcache.install import entry_dirs

FOREIGN = "F" * 52
CLEAN = {"staging": [], "journal": [], "temp": []}


def seed(cache: Path) -> dict:
    """A cache dir that already holds a Triton entry; returns its tree."""
    (cache / FOREIGN).mkdir(parents=True)
    (cache / FOREIGN / "k.json").write_text("{}")
    return tree(cache)


def visible(cache: Path) -> dict:
    return {k: v for k, v in tree(cache).items() if not k.startswith(STATE_DIR)}


def no_receipt(cache: Path) -> bool:
    return not list((cache / STATE_DIR / "installed").glob("*")) if (cache / STATE_DIR).exists() else True


def install_here(bundle: Path, cache: Path):
    return CliRunner().invoke(main, ["install", str(bundle), "--cache-dir", str(cache), "--no-gpu-check"])


def assert_clean_failure(result, cache: Path, before: dict, words: str) -> None:
    assert result.exit_code == StorageError.exit_code, (result.exit_code, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert visible(cache) == before
    assert leftovers(cache) == CLEAN and no_receipt(cache)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.7, 0.9, 0.97])
def test_disk_full_at_any_point_leaves_the_cache_as_it_was(bundle90, tmp_path, fraction):
    need = archive.read_manifest(bundle90).total_size
    with tmpfs(tmp_path / "vol", int(need * fraction)) as vol:
        cache = vol / "cache"
        before = seed(cache)
        result = install_here(bundle90, cache)
        assert_clean_failure(result, cache, {k: v for k, v in before.items()}, "No space left on device")

        resize(vol, need * 4)  # the volume grows (or is cleaned); nothing left behind gets in the way
        assert install_here(bundle90, cache).exit_code == 0
        manifest = archive.read_manifest(bundle90)
        assert bundle_state(cache, manifest, expected_bytes(bundle90)) == "all"


def test_disk_full_in_4k_steps_up_to_the_size_that_fits(bundle90, tmp_path):
    """Finer than the fractions above: every 4 KiB from the bundle's size up, until an install fits.

    The last few failures come after the files are staged: in the group-file rewrites, the staged
    receipt and the journal (a receipt left behind there was found this way). Each is clean.
    """
    import shutil

    need = archive.read_manifest(bundle90).total_size
    failures = 0
    with tmpfs(tmp_path / "vol", need * 4) as vol:
        for size in range(need // 4096 * 4096, need * 3, 4096):
            shutil.rmtree(vol / "cache", ignore_errors=True)
            resize(vol, size)
            cache = vol / "cache"
            before = seed(cache)
            result = install_here(bundle90, cache)
            if result.exit_code == 0:
                break
            assert_clean_failure(result, cache, before, "No space left on device")
            failures += 1
        else:
            pytest.fail(f"no size up to {need * 3} bytes held the install")
        assert bundle_state(cache, archive.read_manifest(bundle90), expected_bytes(bundle90)) == "all"
    assert failures >= 10


def test_out_of_inodes_is_a_clean_error(bundle90, tmp_path):
    with tmpfs(tmp_path / "vol", 64 << 20, inodes=40) as vol:
        cache = vol / "cache"
        before = seed(cache)
        assert_clean_failure(install_here(bundle90, cache), cache, before, "No space left on device")


def test_disk_full_as_a_separate_process(bundle90, tmp_path):
    with tmpfs(tmp_path / "vol", 128 << 10) as vol:
        cache = vol / "cache"
        before = seed(cache)
        done = kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check")
        assert done.returncode == StorageError.exit_code and "No space left" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert visible(cache) == before and leftovers(cache) == CLEAN


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then write() fails with EFBIG instead of killing
    return apply


def test_a_write_failing_midway_without_any_mount(bundle90, tmp_path):
    """RLIMIT_FSIZE stand-in (works without root): the first member over 16 KiB fails to write."""
    cache = tmp_path / "cache"
    before = seed(cache)
    done = subprocess.run([sys.executable, "-m", "kernelcache", "install", str(bundle90), "--cache-dir", str(cache),
                           "--no-gpu-check"], env=clean_env(), cwd=ROOT, capture_output=True, text=True,
                          preexec_fn=_limit_file_size(16 << 10))
    assert done.returncode == StorageError.exit_code and "File too large" in done.stderr, done.stderr
    assert visible(cache) == before and leftovers(cache) == CLEAN and no_receipt(cache)


def test_read_only_target_is_refused_and_untouched(bundle90, tmp_path):
    src = tmp_path / "src"
    before = seed(src / "cache")
    with read_only(src, tmp_path / "ro") as how:
        cache = tmp_path / "ro" / "cache"
        result = install_here(bundle90, cache)
        assert result.exit_code == StorageError.exit_code, (how, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
        assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr
        assert tree(src / "cache") == before


def test_a_read_only_cache_that_already_holds_the_bundle_is_fine(bundle90, tmp_path):
    """An init container re-running `install` against a read-only volume it filled earlier."""
    src = tmp_path / "src"
    assert install_here(bundle90, src / "cache").exit_code == 0
    before = tree(src / "cache")
    with read_only(src, tmp_path / "ro"):
        result = CliRunner().invoke(main, ["install", str(bundle90), "--cache-dir", str(tmp_path / "ro" / "cache"),
                                           "--no-gpu-check", "--json"])
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["action"] == "already-installed"
        # mounted elsewhere than installed: plain Triton would miss every kernel, so env refuses (issue 15);
        # the overlay serves it
        moved = kc("env", "--cache-dir", str(tmp_path / "ro" / "cache"))
        assert moved.returncode == ReadOnlyCache.exit_code and str(src / "cache") in moved.stderr
        assert kc("env", "--read-only", "--cache-dir", str(tmp_path / "ro" / "cache"), "--overlay",
                  str(tmp_path / "ov"), check=True).stdout
    assert tree(src / "cache") == before


def test_a_read_only_cache_served_where_it_was_installed_gets_a_warning(bundle90, tmp_path):
    """Installed, then frozen in place (an image layer, a read-only bind mount): env works and warns."""
    cache = tmp_path / "frozen" / "cache"
    assert install_here(bundle90, cache).exit_code == 0
    with read_only(tmp_path / "frozen", tmp_path / "frozen"):
        done = kc("env", "--cache-dir", str(cache), check=True)
    assert f"TRITON_CACHE_DIR={cache}" in done.stdout
    assert "warning" in done.stderr and "--read-only" in done.stderr


def run_without_dac(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*without_dac(), sys.executable, "-m", "kernelcache", *args], env=clean_env(), cwd=ROOT,
                          capture_output=True, text=True)


def test_permission_denied_on_the_cache_dir(bundle90, tmp_path):
    cache = tmp_path / "cache"
    before = seed(cache)
    cache.chmod(0o555)
    try:
        done = run_without_dac("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check")
    finally:
        cache.chmod(0o755)
    assert done.returncode == StorageError.exit_code and "Permission denied" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert tree(cache) == before


def test_permission_denied_midway_through_publishing_is_rolled_back(bundle90, tmp_path):
    """The last entry to publish is a partial Triton entry in a dir this user may not write: the
    entries already renamed into place are moved back out, and the error is clean."""
    manifest = archive.read_manifest(bundle90)
    last = max(manifest.kernels, key=lambda k: k.key)
    assert entry_dirs(manifest).index(last.key) >= 10  # at least ten entries are renamed in before it fails
    cache = tmp_path / "cache"
    seed(cache)
    (cache / last.key).mkdir()
    (cache / last.key / f"{last.name}.json").write_text("{}")  # torn: Triton died before the group file
    (cache / last.key).chmod(0o555)
    (cache / STATE_DIR).mkdir()  # the state dir is writable: extraction works, publishing fails
    before = visible(cache)
    try:
        done = run_without_dac("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check")
    finally:
        (cache / last.key).chmod(0o755)
    assert done.returncode == StorageError.exit_code and "Permission denied" in done.stderr, done.stderr
    assert visible(cache) == before
    assert leftovers(cache) == CLEAN and no_receipt(cache)
    assert os.listdir(cache / last.key) == [f"{last.name}.json"]
