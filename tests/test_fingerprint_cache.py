"""The fingerprint a cache dir keeps: used only under the key it was computed for, never stale.

An installed bundle is checked again by every ``install`` / ``run --bundle`` (each pod start) from
the record in ``<cache>/.kernelcache/fingerprints/``, without importing Triton or torch. The record
is trusted exactly while its ``EnvironmentKey`` holds; a Triton replaced in place in a real venv
(pip, down and up again) is fingerprinted again and the bundle refused, then accepted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from helpers.common import ROOT, SERVED, clean_env, kc

from kernelcache.errors import FingerprintMismatch
from kernelcache.format.envkey import EnvironmentKey, KnownEnvironment, environment_key
from kernelcache.format.envscan import key_candidates
from kernelcache.format.fingerprint import package_version
from kernelcache.format.manifest import Environment

# The CLI in a process where importing triton or torch fails loudly (the record must make both needless).
# Finding them (importlib.util.find_spec, as the key does) still works: only loading is refused.
BLOCKED = r"""
import importlib.machinery, sys
class Refuse:
    def create_module(self, spec):
        print("blocked import: " + spec.name, file=sys.stderr)
        raise ImportError("blocked: " + spec.name)
    def exec_module(self, module):
        raise ImportError("blocked")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in ("triton", "torch"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = Refuse()
        return spec
sys.meta_path.insert(0, Block())
from kernelcache.cli import main
main(sys.argv[1:], prog_name="kernelcache")
"""

# The CLI, then one JSON line on stderr naming the heavy packages the command imported.
IMPORTS = r"""
import json, sys
from kernelcache.cli import main
try:
    main(sys.argv[1:], prog_name="kernelcache")
    code = 0
except SystemExit as exc:
    code = exc.code or 0
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"triton", "torch"})
print(json.dumps({"exit": code, "imported": heavy}), file=sys.stderr)
"""


def blocked(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], env=clean_env(KERNELCACHE_NO_GPU_PROBE="1"),
                          capture_output=True, text=True, timeout=300)


def records(cache: Path) -> list[Path]:
    return sorted((cache / ".kernelcache" / "fingerprints").glob("*.json"))


def test_noop_install_env_and_run_import_neither_triton_nor_torch(bundle90, tmp_path):
    cache = tmp_path / "c"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)  # computes the record
    assert len(records(cache)) == 1
    done = blocked("install", str(bundle90), "--cache-dir", str(cache))
    assert done.returncode == 0 and "already installed" in done.stdout, done.stderr
    done = blocked("env", "--cache-dir", str(cache), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["TRITON_CACHE_DIR"] == str(cache), done.stderr
    done = blocked("run", "--bundle", str(bundle90), "--cache-dir", str(cache), "--",
                   sys.executable, "-c", "import os; print(os.environ['TRITON_CACHE_DIR'])")
    assert done.returncode == 0 and done.stdout.strip() == str(cache), done.stderr
    assert "blocked import" not in done.stderr


def test_a_record_is_used_exactly_while_its_key_holds(bundle90, tmp_path):
    cache = tmp_path / "c"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    [record] = records(cache)
    known = KnownEnvironment.from_json(record.read_text())
    lying = KnownEnvironment(known.key, dataclasses.replace(known.environment, triton_key_sha256="0" * 64))
    record.write_text(lying.to_json())
    # The record of the accepted install (cachedir/checked.py, tests/test_noop_install.py) would answer first:
    # this test is about the fingerprint record beneath it.
    shutil.rmtree(cache / ".kernelcache" / "checked")
    done = kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check")
    assert done.returncode == FingerprintMismatch.exit_code  # the record's word was taken: same key
    assert "triton_key_sha256" in done.stderr
    # A variable with a key prefix that Triton does not read changes the key: computed again, accepted.
    done = kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check",
              env={"TRITON_KERNELCACHE_TEST_UNREAD": "1"})
    assert done.returncode == 0 and "already installed" in done.stdout, done.stderr
    assert len(records(cache)) == 2
    # A record under another key's file name is not used either.
    record.write_text(lying.to_json())
    other = next(p for p in records(cache) if p != record)
    other.write_text(lying.to_json())
    done = kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check",
              env={"TRITON_KERNELCACHE_TEST_UNREAD": "1"})
    assert done.returncode == 0, done.stderr


def test_key_changes_with_each_part_it_names(monkeypatch):
    base = environment_key()
    assert base.triton and any(p.startswith("_C/libtriton") for p in base.triton)
    assert base.ptxas and base.distributions["triton"]
    for var in ("TRITON_DEFAULT_FP_FUSION", "MLIR_ENABLE_DUMP", "PTXAS_OPTIONS", "TRITON_PTXAS_PATH"):
        monkeypatch.setenv(var, "1")
        assert environment_key() != base, var
        monkeypatch.delenv(var)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")  # where the cache is, not what it holds
    monkeypatch.setenv("HOSTNAME", "another-pod")
    assert environment_key() == base


def test_records_round_trip_through_json():
    known = KnownEnvironment(environment_key(), Environment("cp312", "x86_64-linux", "3.6.0", "ab" * 32,
                                                            {"sm_90": "ptxas\nrelease 12.8"}, {"X": "1"}))
    assert KnownEnvironment.from_json(known.to_json()) == known
    assert EnvironmentKey.from_dict(known.key.to_dict()).digest == known.key.digest
    for bad in ("[]", "{}", '{"key": {}, "environment": {}}', "not json"):
        with pytest.raises(ValueError):
            KnownEnvironment.from_json(bad)


LIST_TRITONS_VARIABLES = r"""
import json, os, re, pathlib
import triton
from triton._C.libtriton import get_cache_invalidating_env_vars
lib = next(pathlib.Path(triton.__file__).parent.joinpath("_C").glob("libtriton*"))
names = sorted({m.decode() for m in re.findall(rb"[A-Z][A-Z0-9]*_[A-Z0-9_]+", lib.read_bytes())})
# libtriton reports the ones that are set: set every name it holds, a few thousand at a time (glibc's setenv scans
# the whole environment for each name: all of libtriton's 96,000 at once cost about 25 s of CPU).
reported = set()
for start in range(0, len(names), 2000):
    chunk = names[start:start + 2000]
    os.environ.update(dict.fromkeys(chunk, "1"))
    reported |= set(get_cache_invalidating_env_vars())
    for name in chunk:
        del os.environ[name]
print(json.dumps(sorted(reported)))
"""


def test_key_covers_every_variable_triton_reads_into_its_keys():
    done = subprocess.run([sys.executable, "-c", LIST_TRITONS_VARIABLES], capture_output=True, text=True,
                          env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    names = json.loads(done.stdout)
    assert "TRITON_DEFAULT_FP_FUSION" in names and len(names) > 10  # the listing really found the list
    assert sorted(key_candidates(dict.fromkeys(names, "1"))) == names


# -- a real venv whose Triton is replaced in place -----------------------------------------------------


def other_triton(version: str) -> str:
    return "3.5.1" if version != "3.5.1" else "3.6.0"


def pip(python: Path, *args: str) -> None:
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *args], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def install_in(python: Path, bundle: Path, cache: Path) -> tuple[dict, subprocess.CompletedProcess]:
    done = subprocess.run([str(python), "-c", IMPORTS, "install", str(bundle), "--cache-dir", str(cache)],
                          env=clean_env(PYTHONPATH=str(ROOT), KERNELCACHE_NO_GPU_PROBE="1"),
                          capture_output=True, text=True, timeout=600)
    return json.loads(done.stderr.strip().splitlines()[-1]), done


def served_in(python: Path, cache: Path) -> dict:
    """test_triton_key_seed's probe, in a process ``kernelcache run`` starts in the venv."""
    done = subprocess.run([str(python), "-c", IMPORTS, "run", "--cache-dir", str(cache), "--", str(python), "-c",
                           SERVED], env=clean_env(PYTHONPATH=str(ROOT), KERNELCACHE_NO_GPU_PROBE="1"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_triton_replaced_in_a_venv_is_fingerprinted_again(bundle90, tmp_path):
    ours = package_version("triton")
    where = tmp_path / "venv"
    venv.create(where, with_pip=True)
    python = where / "bin" / "python"
    pip(python, f"triton=={ours}", "click", "filelock", "zstandard", "rich")
    cache = tmp_path / "c"

    # The bundle's own Triton: taken from the bundle's identity record (tests/test_fingerprint_identity.py),
    # accepted without importing Triton.
    first, done = install_in(python, bundle90, cache)
    assert first == {"exit": 0, "imported": []}, done.stderr
    kept = {"seeded": True, "equal": True, "read_libtriton": False}
    assert served_in(python, cache) == kept  # served processes take the install's triton_key()
    again, done = install_in(python, bundle90, cache)
    assert again == {"exit": 0, "imported": []} and "already installed" in done.stdout, done.stderr

    pip(python, f"triton=={other_triton(ours)}")  # replaced in place: same paths, other files
    refused, done = install_in(python, bundle90, cache)  # neither the record nor the bundle vouches: computed
    assert refused == {"exit": FingerprintMismatch.exit_code, "imported": ["triton"]}, done.stderr
    assert "triton_key_sha256" in done.stderr and other_triton(ours) in done.stderr
    refused, done = install_in(python, bundle90, cache)  # a refusal keeps no record: checked again, refused
    assert refused["exit"] == FingerprintMismatch.exit_code, done.stderr
    # The kept triton_key() is the old Triton's: a served process computes its own.
    assert served_in(python, cache) == {"seeded": True, "equal": True, "read_libtriton": True}

    pip(python, f"triton=={ours}")  # back to the bundle's Triton, new files: the bundle vouches again
    back, done = install_in(python, bundle90, cache)
    assert back == {"exit": 0, "imported": []}, done.stderr
    last, done = install_in(python, bundle90, cache)
    assert last == {"exit": 0, "imported": []}, done.stderr
    assert served_in(python, cache) == kept  # kept again by the install that computed it


@pytest.mark.parametrize("name", ["triton", "torch", "vllm", "flashinfer-python", "apache-tvm-ffi", "click",
                                  "zstandard", "filelock", "Flashinfer_Python", "FILELOCK", "no-such-distribution"])
def test_the_installers_version_lookup_is_importlib_metadatas(name):
    """An install reads versions with envscan.distribution_version (the identity record's fingerprint, tvm-ffi,
    FlashInfer's site): what importlib.metadata.version says, without its 15 ms of imports."""
    from kernelcache.format.envscan import distribution_version

    assert distribution_version(name) == package_version(name)
