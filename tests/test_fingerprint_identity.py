"""A first install fingerprints a Triton identical to the build's from the bundle's identity record.

A bundle names the Triton it was built with by content (``triton_identity``: every file ``triton_key()``
reads, sources by sha256 and shared libraries by size and GNU build ID; the ptxas Triton ran; the key
candidates its processes had; ``triton_key()`` itself). An install into a fresh cache dir then takes the
fingerprint without importing Triton or hashing libtriton.so, and keeps ``triton_key()`` for served
processes. These tests show the fingerprint so taken equals Triton's own under the same environment,
that every change the record cannot vouch for falls back to Triton's computation, and that a served process
after such an install never reads libtriton.so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys

import pytest
from helpers.bundles import with_identity
from helpers.common import ROOT, SERVED, clean_env, kc
from test_fingerprint_cache import blocked, records

from kernelcache.errors import FingerprintMismatch
from kernelcache.format import archive
from kernelcache.format.envkey import KnownEnvironment

pytestmark = pytest.mark.fast

# Both fingerprints in one process with the test's environment: from the record (no Triton import before
# it), then Triton's own.
BOTH = r"""
import json, sys
from dataclasses import asdict
from kernelcache.format import archive
from kernelcache.format.envscan import package_dir
from kernelcache.format.fingerprint import local_environment, package_version
from kernelcache.format.identity import environment_from
manifest = archive.read_manifest(sys.argv[1])
fast = environment_from(manifest.triton_identity, manifest.environment, ["sm_90"], package_dir("triton"),
                        package_version)
imported = "triton" in sys.modules
print(json.dumps({"fast": asdict(fast) if fast else None, "imported": imported,
                  "triton": asdict(local_environment(["sm_90"]))}))
"""


def both(bundle, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", BOTH, str(bundle)], env=clean_env(**env), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_bundle_names_its_triton_by_content(bundle90):
    manifest = archive.read_manifest(bundle90)
    record = manifest.triton_identity
    assert record is not None
    assert hashlib.sha256(record.triton_key.encode()).hexdigest() == manifest.environment.triton_key_sha256
    [lib] = [v for k, v in record.files.items() if k.startswith("_C/libtriton")]
    assert lib.startswith("elf:")  # known by its build ID: the 400 MB are never read to check it
    assert record.files["runtime/cache.py"].startswith("sha256:")
    assert record.ptxas == {"sm_90": "backends/nvidia/bin/ptxas"}
    assert archive.read_manifest(bundle90).to_dict()["triton_identity"]["files"] == record.files  # round trip


@pytest.mark.parametrize("env", [{}, {"PTXAS_OPTIONS": "-v"}, {"TRITON_DEFAULT_FP_FUSION": "0"}])
def test_the_fingerprint_from_the_record_equals_tritons_own(bundle90, tmp_path, env):
    found = both(bundle90, **env)
    if "TRITON_DEFAULT_FP_FUSION" in env:  # a variable the build did not have: unknowable, so not guessed
        assert found["fast"] is None
        return
    assert found["fast"] == found["triton"] and not found["imported"]


def test_first_install_takes_the_record_without_importing_triton(bundle90, tmp_path):
    cache = tmp_path / "c"
    done = blocked("install", str(bundle90), "--cache-dir", str(cache))
    assert done.returncode == 0 and "blocked import" not in done.stderr, done.stderr
    [record] = records(cache)
    kept = KnownEnvironment.from_json(record.read_text()).environment
    assert dataclasses.asdict(kept) == both(bundle90)["triton"]
    # ... and kept triton_key() for served processes: they never read libtriton.so.
    served = subprocess.run([sys.executable, "-c", "import sys; from kernelcache.cli import main; main(sys.argv[1:])",
                             "run", "--cache-dir", str(cache), "--", sys.executable, "-c", SERVED],
                            env=clean_env(PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert json.loads(served.stdout) == {"seeded": True, "equal": True, "read_libtriton": False}, served.stderr


def lie(record, **changes):
    return dataclasses.replace(record, **changes)


@pytest.mark.parametrize("case", ["no record", "another libtriton", "a file more", "a file fewer",
                                  "no ptxas for the arch", "a variable the build lacked", "another ptxas"])
def test_anything_the_record_cannot_vouch_for_falls_back_to_triton(bundle90, tmp_path, case):
    record = archive.read_manifest(bundle90).triton_identity
    lib = next(k for k in record.files if k.startswith("_C/libtriton"))
    changed = {
        "no record": None,
        "another libtriton": lie(record, files={**record.files, lib: "elf:1:00"}),
        "a file more": lie(record, files={**record.files, "compiler/extra.py": "sha256:00"}),
        "a file fewer": lie(record, files={k: v for k, v in record.files.items() if k != "runtime/cache.py"}),
        "no ptxas for the arch": lie(record, ptxas={}),
    }.get(case, record)
    env = {"a variable the build lacked": {"TRITON_KERNELCACHE_TEST_UNREAD": "1"},
           "another ptxas": {"TRITON_PTXAS_PATH": "/nonexistent/ptxas"}}.get(case, {})
    bundle = with_identity(bundle90, tmp_path / "b.tar.zst", changed)
    done = subprocess.run([sys.executable, "-c", BLOCKED_CLI, "install", str(bundle), "--cache-dir",
                           str(tmp_path / "c")], env=clean_env(KERNELCACHE_NO_GPU_PROBE="1", **env),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "blocked import: triton" in done.stderr, done.stderr
    assert not (tmp_path / "c").exists()  # refused (Triton could not be imported) before anything was written
    # Unblocked, Triton computes it, and the bundle is accepted: the record's lies changed nothing.
    done = kc("install", str(bundle), "--cache-dir", str(tmp_path / "c"), "--no-gpu-check", env=env)
    assert done.returncode == 0, done.stderr


def test_a_record_that_matches_cannot_hide_a_mismatch(bundle90, tmp_path):
    """The record gives this Triton's fingerprint, which is then compared as always: a bundle whose
    environment says another ptxas is refused without Triton being imported."""
    from helpers.bundles import rewrite

    other = rewrite(bundle90, tmp_path / "other.tar.zst", ptxas={"sm_90": "ptxas: another release"})
    done = blocked("install", str(other), "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == FingerprintMismatch.exit_code and "ptxas[sm_90]" in done.stderr, done.stderr
    assert "blocked import" not in done.stderr


BLOCKED_CLI = (ROOT / "tests" / "test_fingerprint_cache.py").read_text().split('BLOCKED = r"""')[1].split('"""')[0]
