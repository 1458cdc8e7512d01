"""An install whose file fails its member check never exits 0, and a refused install leaves nothing behind.

A corrupt copy of a bundle whose manifest still parses has the good copy's digest: with the good copy installed,
it used to be answered "already installed" (exit 0) from the manifest alone. And a bundle that failed its member
check left an empty ``.kernelcache/{lock,journal,installed,staging}`` skeleton in a cache dir it had created.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.common import kc, tree
from helpers.hostile import bundle as hostile_bundle
from helpers.hostile import load_base, regular

from kernelcache.errors import IntegrityError

NO_GPU = {"KERNELCACHE_NO_GPU_PROBE": "1"}


@pytest.fixture(scope="module")
def damaged(small_bundle, tmp_path_factory) -> Path:
    """The small bundle with one bit of one cubin flipped: the same manifest, so the same digest."""
    where = tmp_path_factory.mktemp("damaged")
    base = load_base(small_bundle, where / "escape")
    name, _ = base.member(".cubin")
    path = where / "small-sm_90.tar.zst"
    path.write_bytes(hostile_bundle(base, None, [regular(n, bytes([d[0] ^ 1]) + d[1:] if n == name else d)
                                                 for n, d in base.members]))
    return path


def test_a_corrupt_copy_of_an_installed_bundle_is_refused(small_bundle, damaged, tmp_path):
    cache = tmp_path / "c"
    kc("install", str(small_bundle), "--cache-dir", str(cache), env=NO_GPU, check=True)
    before = tree(cache)
    for _ in range(2):  # and again: a refused file leaves no record that would answer for it
        done = kc("install", str(damaged), "--cache-dir", str(cache), env=NO_GPU)
        assert done.returncode == IntegrityError.exit_code, (done.returncode, done.stdout, done.stderr[-1000:])
        assert "sha256" in done.stderr or "differs" in done.stderr, done.stderr
    assert {k: v for k, v in tree(cache).items() if "/checked/" not in f"/{k}"} == {
        k: v for k, v in before.items() if "/checked/" not in f"/{k}"}
    again = kc("install", str(small_bundle), "--cache-dir", str(cache), env=NO_GPU, check=True)
    assert again.stdout.startswith("already installed")  # the good copy still is


def test_a_good_copy_at_another_path_is_checked_and_answered(small_bundle, tmp_path):
    cache = tmp_path / "c"
    kc("install", str(small_bundle), "--cache-dir", str(cache), env=NO_GPU, check=True)
    copy = tmp_path / "copy.tar.zst"
    shutil.copy(small_bundle, copy)
    done = kc("install", str(copy), "--cache-dir", str(cache), env=NO_GPU, check=True)
    assert done.stdout.startswith("already installed")


def test_a_refused_install_leaves_no_cache_dir_it_made(damaged, tmp_path):
    for cache in (tmp_path / "new", tmp_path / "deeper" / "new"):
        done = kc("install", str(damaged), "--cache-dir", str(cache), env=NO_GPU)
        assert done.returncode == IntegrityError.exit_code, done.stderr[-1000:]
        assert not cache.exists() and not (tmp_path / "deeper").exists()


def test_a_refused_install_into_an_existing_dir_leaves_it_as_it_was(damaged, tmp_path):
    cache = tmp_path / "mine"
    cache.mkdir()
    (cache / "notes.txt").write_text("mine")
    done = kc("install", str(damaged), "--cache-dir", str(cache), env=NO_GPU)
    assert done.returncode == IntegrityError.exit_code
    assert sorted(p.name for p in cache.iterdir()) == ["notes.txt"]
