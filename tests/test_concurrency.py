"""Many installs at once into one cache dir, and installs under a Triton process that reads the cache.

Real processes: each installer is a separate Python running the ``kernelcache install`` command,
released together by a start file once its imports and fingerprint are done; the reader is a
separate Python using Triton's own ``FileCacheManager``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.bundles import split
from helpers.cachecheck import bundle_state, expected_bytes, leftovers
from helpers.common import ROOT, clean_env

from kernelcache.cachedir import STATE_DIR, CacheDir
from kernelcache.format import archive
from kernelcache.install import InstallPlan

PROCS = Path(__file__).parent / "helpers" / "procs.py"
FOREIGN = "F" * 52


def start_installers(bundles: list[Path], cache: Path, go: Path) -> list[subprocess.Popen]:
    env = clean_env(KERNELCACHE_NO_GPU_PROBE="1")
    return [subprocess.Popen([sys.executable, str(PROCS), "install", str(b), str(cache), str(go)], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for b in bundles]


def release_and_wait(procs: list[subprocess.Popen], go: Path) -> list[tuple[dict, dict]]:
    """Once every installer is warm, release them together; each returns (what `install --json`
    printed, what it then read back)."""
    deadline = time.monotonic() + 300
    while len(list(go.parent.glob(f"{go.name}.ready.*"))) < len(procs):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "an installer died warming up"
        time.sleep(0.05)
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (proc.returncode, out[-1000:], err[-2000:])
        lines = out.strip().splitlines()
        results.append((json.loads("\n".join(lines[:-1])), json.loads(lines[-1])))
    return results


def extractions(cache: Path) -> list[dict]:
    log = cache / STATE_DIR / "log.jsonl"
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["event"] == "extracted"]


def test_32_processes_installing_one_bundle_extract_it_once(bundle90, tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    procs = start_installers([bundle90] * 32, cache, go)
    results = release_and_wait(procs, go)

    manifest = archive.read_manifest(bundle90)
    (tmp_path / "installers.json").write_text(json.dumps({
        "processes": len(results), "extractions": len(extractions(cache)),
        "states": [read["state"] for _, read in results], "actions": [printed["action"] for printed, _ in results]}))
    assert [read["state"] for _, read in results] == ["all"] * 32  # every process, on return, saw it all
    assert sorted(printed["action"] for printed, _ in results) == ["already-installed"] * 31 + ["installed"]
    assert len(extractions(cache)) == 1
    assert bundle_state(cache, manifest, expected_bytes(bundle90)) == "all"
    assert leftovers(cache) == {"staging": [], "journal": [], "temp": []}


def test_two_different_bundles_at_once_both_complete_neither_clobbers(bundle90, tmp_path):
    """Bundles A and B share 4 kernels and 2 launchers; 4 processes install each, all released together."""
    a = split(bundle90, tmp_path / "a.tar.zst", slice(0, 12), slice(0, 4))
    b = split(bundle90, tmp_path / "b.tar.zst", slice(8, 21), slice(2, 6))
    cache, go = tmp_path / "cache", tmp_path / "go"
    (cache / FOREIGN).mkdir(parents=True)
    (cache / FOREIGN / "mine.json").write_text("keep me")
    results = release_and_wait(start_installers([a, b] * 4, cache, go), go)

    assert all(read["state"] == "all" for _, read in results)
    for bundle in (a, b):
        manifest = archive.read_manifest(bundle)
        assert bundle_state(cache, manifest, expected_bytes(bundle)) == "all"
        digest = archive.bundle_digest(manifest)
        assert sum(e["digest"] == digest for e in extractions(cache)) == 1
    assert len(CacheDir(cache).receipts()) == 2
    assert (cache / FOREIGN / "mine.json").read_text() == "keep me"
    assert leftovers(cache) == {"staging": [], "journal": [], "temp": []}


@pytest.mark.parametrize("rounds", [20])
def test_a_triton_reader_never_sees_a_partial_entry_during_installs(bundle90, tmp_path, rounds):
    """A Triton process looks up every kernel over and over while installs publish under it.

    Its ``FileCacheManager`` creates each key dir it looks up (as Triton does), so most entries are
    published into an existing empty dir, file by file with the group file last.
    """
    manifest = archive.read_manifest(bundle90)
    pointer, stop, out = tmp_path / "pointer", tmp_path / "stop", tmp_path / "reader.json"
    reader = subprocess.Popen([sys.executable, str(PROCS), "read", str(bundle90), str(pointer), str(stop), str(out)],
                              cwd=ROOT, env=clean_env(), stderr=subprocess.PIPE, text=True)
    try:
        for i in range(rounds):
            cache = tmp_path / f"c{i}"
            cache.mkdir()
            pointer.write_text(str(cache))
            time.sleep(0.3 if i == 0 else 0.02)  # the first round waits for the reader's imports
            InstallPlan(bundle90, manifest, archive.bundle_digest(manifest), cache).execute()
            time.sleep(0.02)
    finally:
        stop.touch()
        reader.wait(timeout=120)
    assert reader.returncode == 0, reader.stderr.read()[-2000:]
    seen = json.loads(out.read_text())
    (tmp_path / "seen.json").write_text(json.dumps({**seen, "installs": rounds}))
    assert seen["partial"] == 0, seen["problems"]
    assert seen["snapshots"] > rounds and seen["complete"] > 0 and seen["absent"] > 0, seen
