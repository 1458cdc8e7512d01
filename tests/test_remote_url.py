"""pull / install from file://, a real HTTP server on loopback, and fsspec URLs."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil

import pytest
from helpers.common import kc, run_job, tree
from helpers.servers import http_server

import kernelcache
from kernelcache.errors import IntegrityError, MissingDependency, RemoteError, StorageError, UsageError
from kernelcache.format import archive


@pytest.fixture()
def site(bundle90, tmp_path):
    """A directory served over HTTP holding the real bundle and a corrupted copy of it."""
    root = tmp_path / "www"
    root.mkdir()
    shutil.copy(bundle90, root / bundle90.name)
    data = bytearray(bundle90.read_bytes())
    data[len(data) // 2] ^= 0xFF
    (root / "corrupt.tar.zst").write_bytes(bytes(data))
    with http_server(root) as url:
        yield url


def only_files(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_file_url_pull_and_install(bundle90, tmp_path):
    out = tmp_path / "out"
    kc("pull", bundle90.as_uri(), "-o", str(out), check=True)
    assert (out / bundle90.name).read_bytes() == bundle90.read_bytes()
    cache, downloads = tmp_path / "cache", tmp_path / "downloads" / "nested"
    result = json.loads(kc("install", bundle90.as_uri(), "--cache-dir", str(cache), "--json",
                           env={"KERNELCACHE_DOWNLOAD_DIR": str(downloads)}, check=True).stdout)
    assert result["digest"] == archive.bundle_digest(archive.read_manifest(bundle90))
    assert list(downloads.iterdir()) == []  # the download is removed once installed
    done = kc("install", bundle90.as_uri(), "--cache-dir", str(tmp_path / "c2"),
              env={"KERNELCACHE_DOWNLOAD_DIR": "/proc/kernelcache-cannot-be-here"})
    assert done.returncode == StorageError.exit_code and "download dir" in done.stderr
    done = kc("pull", f"file://otherhost{bundle90}", "-o", str(out))
    assert done.returncode == UsageError.exit_code
    done = kc("pull", (tmp_path / "missing.tar.zst").as_uri(), "-o", str(out))
    assert done.returncode == RemoteError.exit_code and only_files(out) == [bundle90.name]


def test_a_refused_pull_keeps_the_file_already_there(bundle90, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / bundle90.name).write_text("the user's own file")
    done = kc("pull", bundle90.as_uri(), "--gpu", "a100", "-o", str(out))  # an sm_90 bundle, an sm_80 GPU
    assert done.returncode == 21 and "not for --gpu a100" in done.stderr.strip().splitlines()[-1]  # after its table
    assert only_files(out) == [bundle90.name] and (out / bundle90.name).read_text() == "the user's own file"
    done = kc("pull", bundle90.as_uri(), "--gpu", "no-such-gpu", "-o", str(tmp_path / "fresh"))
    assert done.returncode == 2 and only_files(tmp_path / "fresh") == []  # refused before any download


def test_http_install_then_every_kernel_hits(site, bundle90, tmp_path):
    cache = tmp_path / "cache"
    kc("install", f"{site}/{bundle90.name}", "--cache-dir", str(cache), check=True)
    before = tree(cache)
    _, replay = run_job(tmp_path / "w", cache, 90)
    assert replay and all(r["cache_hit"] for r in replay)
    assert tree(cache) == before


def test_http_pull_verifies_and_pins(site, bundle90, tmp_path):
    out = tmp_path / "out"
    sha = hashlib.sha256(bundle90.read_bytes()).hexdigest()
    kc("pull", f"{site}/{bundle90.name}#sha256={sha}", "-o", str(out), check=True)
    assert (out / bundle90.name).read_bytes() == bundle90.read_bytes()

    wrong = tmp_path / "wrong"
    done = kc("pull", f"{site}/{bundle90.name}#sha256={'0' * 64}", "-o", str(wrong))
    assert done.returncode == IntegrityError.exit_code and only_files(wrong) == []
    assert kc("pull", f"{site}/{bundle90.name}#md5=abc", "-o", str(wrong)).returncode == UsageError.exit_code


def test_failed_http_downloads_leave_nothing_that_looks_complete(site, bundle90, tmp_path):
    out = tmp_path / "out"
    cases = {f"{site}/truncated/{bundle90.name}": (RemoteError.exit_code,),  # hangs up half way
             f"{site}/nothing-here.tar.zst": (RemoteError.exit_code,),
             f"{site}/corrupt.tar.zst": (11, 14)}  # served whole, fails member verification
    for url, codes in cases.items():
        done = kc("pull", url, "-o", str(out))
        assert done.returncode in codes, (url, done.stderr)
        assert done.stderr.startswith("kernelcache: error:") and len(done.stderr.strip().splitlines()) == 1
        assert only_files(out) == [], url
    cache = tmp_path / "cache"
    assert kc("install", f"{site}/truncated/{bundle90.name}", "--cache-dir", str(cache)).returncode == 60
    assert not cache.exists()


def test_fsspec_urls_in_process(bundle90, tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/bundles/test-sm_90.tar.zst", bundle90.read_bytes())
    [landed] = kernelcache.pull("memory://bundles/test-sm_90.tar.zst", tmp_path)
    assert landed.path.read_bytes() == bundle90.read_bytes()
    assert landed.digest == archive.bundle_digest(archive.read_manifest(bundle90))
    with pytest.raises(RemoteError, match="not found"):
        kernelcache.pull("memory://bundles/absent.tar.zst", tmp_path / "x")
    with pytest.raises(UsageError):
        kernelcache.pull(str(bundle90), tmp_path)  # a plain path is not something to pull


@pytest.mark.skipif(importlib.util.find_spec("s3fs") is not None, reason="s3fs is installed")
def test_a_missing_fsspec_backend_is_named(tmp_path):
    done = kc("pull", "s3://bucket/bundles/x.tar.zst", "-o", str(tmp_path))
    assert done.returncode == MissingDependency.exit_code and "s3fs" in done.stderr
    assert kc("pull", "nosuchscheme://x/y.tar.zst", "-o", str(tmp_path)).returncode == UsageError.exit_code
