"""Bad input to every command: one line on stderr, its own exit code, no traceback, nothing left behind.

Each case is a real ``python -m kernelcache`` process. The cases come from a sweep of odd but plausible
inputs (missing and wrong-kind paths, unwritable outputs, malformed logs and receipts, env vars and
flags out of range); each was a traceback, a wrong exit code or a silent success before it was fixed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.common import clean_env, kc

from kernelcache.errors import (
    BaseUnusable,
    KeyFileError,
    NotACacheDir,
    NotInstalled,
    RecipeError,
    RemoteError,
    StorageError,
    UsageError,
)
from kernelcache.format import archive

USAGE, MANIFEST, STORAGE, BASE, REMOTE = (UsageError.exit_code, RecipeError.exit_code, StorageError.exit_code,
                                          BaseUnusable.exit_code, RemoteError.exit_code)
NOT_INSTALLED, NOT_A_CACHE = NotInstalled.exit_code, NotACacheDir.exit_code
BUILD = ("build", "--arch", "sm_90", "--gpu", "h200", "--vocab", "32768", "--dtype", "float32", "--path", "mrv2")


def installed(bundle: Path, where: Path) -> Path:
    kc("install", str(bundle), "--cache-dir", str(where), env={"KERNELCACHE_NO_GPU_PROBE": "1"}, check=True)
    return where


def receipt_of(cache: Path) -> Path:
    [receipt] = (cache / ".kernelcache" / "installed").glob("*.json")
    return receipt


def case_setup(name: str, bundle: Path, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """(argv, extra env) for case ``name``; files it needs are made under ``tmp``."""
    afile = tmp / "afile"
    afile.write_text("a plain file")
    missing = str(tmp / "missing.tar.zst")
    log = tmp / "numbers.jsonl"
    log.write_text("5\n[1, 2]\n")
    cases = {
        "install a missing bundle": (["install", missing, "--cache-dir", str(tmp / "c")], {}),
        "install a directory": (["install", str(tmp), "--cache-dir", str(tmp / "c")], {}),
        "diff with a missing bundle": (["diff", str(bundle), missing], {}),
        "merge with a missing bundle": (["merge", str(bundle), missing, "-o", str(tmp / "m.tar.zst")], {}),
        "pack into a path under a file": (["pack", "CACHE", "-o", str(afile / "x.tar.zst")], {}),
        "pack for a garbage arch": (["pack", "CACHE", "-o", str(tmp / "p.tar.zst"), "--arch", "garbage"], {}),
        "pack with a missing compile log": (["pack", "CACHE", "-o", str(tmp / "p.tar.zst"), "--compile-log",
                                             str(tmp / "nope.jsonl")], {}),
        "pack with a garbage SOURCE_DATE_EPOCH": (["pack", "CACHE", "-o", str(tmp / "p.tar.zst")],
                                                  {"SOURCE_DATE_EPOCH": "yesterday"}),
        "build with --jobs 0": ([*BUILD, "--jobs", "0", "-o", str(tmp / "b")], {}),
        "build for sm_90aaf": (["build", "--arch", "sm_90aaf", "-o", str(tmp / "b")], {}),
        "build for sm_999": (["build", "--arch", "sm_999", "-o", str(tmp / "b")], {}),
        "install for an unknown arch": (["install", str(bundle), "--arch", "sm_999", "--cache-dir", str(tmp / "c")],
                                        {}),
        "install for an unknown GPU": (["install", str(bundle), "--gpu", "h900", "--cache-dir", str(tmp / "c")], {}),
        "build for sm_90 with an sm_80 GPU": (["build", "--arch", "sm_90", "--gpu", "a100", "-o", str(tmp / "b")], {}),
        "build into a path under a file": ([*BUILD, "-o", str(afile / "sub")], {}),
        "build from a miss log of numbers": ([*BUILD, "--from-misses", str(log), "-o", str(tmp / "b")], {}),
        "build a manifest named ../escaped": ([*BUILD, "--manifest", "ESCAPE", "-o", str(tmp / "b")], {}),
        "build a recipe no one ships": ([*BUILD, "--recipe", "qwen9-1t", "-o", str(tmp / "b")], {}),
        "build signed with a key that is not one": ([*BUILD, "--sign", str(afile), "-o", str(tmp / "b")], {}),
        "push signed with a key that is not one": (["push", str(bundle), "oci://127.0.0.1:1/kc/x:v1", "--sign",
                                                    str(afile)], {}),
        "pull into a path under a file": (["pull", bundle.as_uri(), "-o", str(afile / "sub")], {}),
        "pull from a refusing ftp server": (["pull", "ftp://127.0.0.1:1/x.tar.zst", "-o", str(tmp / "d")], {}),
        "run a directory": (["run", "--cache-dir", str(tmp / "c"), "--", str(tmp)], {}),
        "run an empty command name": (["run", "--cache-dir", str(tmp / "c"), "--", ""], {}),
        "capture a directory": (["capture", "-o", str(tmp / "x.tar.zst"), "--", str(tmp)], {}),
        "a garbage lock timeout": (["install", str(bundle), "--cache-dir", str(tmp / "c")],
                                   {"KERNELCACHE_LOCK_TIMEOUT": "soon"}),
        "a garbage size limit variable": (["install", str(bundle), "--cache-dir", str(tmp / "c")],
                                          {"KERNELCACHE_MAX_TOTAL_BYTES": "lots"}),
        "a zero size limit": (["install", str(bundle), "--cache-dir", str(tmp / "c"), "--max-total", "0"], {}),
        "KERNELCACHE_HOME is a file": (["env"], {"KERNELCACHE_HOME": str(afile)}),
        "a read-only base with a corrupt receipt": (["env", "--read-only", "--base", "BROKEN", "--overlay",
                                                     str(tmp / "o")], {}),
        "verify a cache whose receipt lost its manifest": (["verify", "--cache-dir", "NOMANIFEST"], {}),
        "verify a merged bundle": (["verify", "MERGED"], {}),
        "rm a bundle that is not installed": (["rm", "nosuch", "--cache-dir", "INSTALLED"], {}),
        "rm from a cache dir with a corrupt receipt": (["rm", "small-sm_90", "--cache-dir", "BROKEN"], {}),
        "ls a cache dir that does not exist": (["ls", "--cache-dir", str(tmp / "nowhere")], {}),
        "prune a dir that is not a cache dir": (["prune", "--cache-dir", str(tmp)], {}),
        "tune a bundle into itself": (["tune", str(bundle), "-o", str(bundle)], {}),
        "tune in a cache dir that holds files": (["tune", str(bundle), "--cache-dir", str(tmp)], {}),
    }
    return cases[name]


EXPECTED = {
    "install a missing bundle": (USAGE, "no bundle at"),
    "install a directory": (USAGE, "no bundle at"),
    "diff with a missing bundle": (USAGE, "no bundle at"),
    "merge with a missing bundle": (USAGE, "no bundle at"),
    "pack into a path under a file": (STORAGE, "cannot write"),
    "pack for a garbage arch": (USAGE, "--arch must look like"),
    "pack with a missing compile log": (USAGE, "does not exist"),
    "pack with a garbage SOURCE_DATE_EPOCH": (USAGE, "SOURCE_DATE_EPOCH"),
    "build with --jobs 0": (USAGE, "--jobs"),
    "build for sm_90aaf": (USAGE, "--arch must look like"),
    "build for sm_999": (USAGE, "--arch sm_999: unknown arch, no CUDA GPU has it (known: sm_80,"),
    "install for an unknown arch": (USAGE, "--arch sm_999: unknown arch, no CUDA GPU has it"),
    "install for an unknown GPU": (USAGE, "unknown GPU profile 'h900' (known: a100,"),
    "build for sm_90 with an sm_80 GPU": (USAGE, "pass --gpu with a profile of sm_90 (h100-pcie, h100-sxm, h20, h200)"),
    "build into a path under a file": (STORAGE, "afile"),
    "build from a miss log of numbers": (USAGE, "is not a kernelcache miss log"),
    "build a manifest named ../escaped": (MANIFEST, "must be a plain name"),
    "build a recipe no one ships": (MANIFEST, "qwen9-1t: no such build recipe (shipped: vllm-sampler,"),
    "build signed with a key that is not one": (KeyFileError.exit_code, "is not a PEM private key"),
    "push signed with a key that is not one": (KeyFileError.exit_code, "is not a PEM private key"),
    "pull into a path under a file": (STORAGE, "cannot write"),
    "pull from a refusing ftp server": (REMOTE, "cannot connect"),
    "run a directory": (USAGE, "cannot run"),
    "run an empty command name": (USAGE, "cannot run"),
    "capture a directory": (USAGE, "cannot run"),
    "a garbage lock timeout": (USAGE, "KERNELCACHE_LOCK_TIMEOUT"),
    "a garbage size limit variable": (USAGE, "KERNELCACHE_MAX_TOTAL_BYTES"),
    "a zero size limit": (USAGE, "would refuse every bundle"),
    "KERNELCACHE_HOME is a file": (USAGE, "is a file, not a directory"),
    "a read-only base with a corrupt receipt": (BASE, "is unreadable"),
    "verify a cache whose receipt lost its manifest": (USAGE, "holds no installed bundle"),
    "verify a merged bundle": (USAGE, "a merged bundle records no single build plan"),
    "rm a bundle that is not installed": (NOT_INSTALLED, "no bundle named or with digest 'nosuch'"),
    "rm from a cache dir with a corrupt receipt": (NOT_A_CACHE, "is unreadable"),
    "ls a cache dir that does not exist": (NOT_A_CACHE, "does not exist"),
    "prune a dir that is not a cache dir": (NOT_A_CACHE, "is not a kernelcache cache dir"),
    "tune a bundle into itself": (USAGE, "is the bundle being tuned"),
    "tune in a cache dir that holds files": (USAGE, "must be absent or empty"),
}


def _placeholders(argv: list[str], bundle: Path, cache90: Path, tmp: Path) -> list[str]:
    """Fill in the inputs that take real work to make, only for the cases that use them."""
    if "ESCAPE" in argv:
        manifest = tmp / "escape.toml"
        manifest.write_text('name = "../escaped"\ngpus = ["h200"]\n[[vocab]]\nsize = 32768\n')
        argv = [str(manifest) if a == "ESCAPE" else a for a in argv]
    if "BROKEN" in argv:
        broken = installed(bundle, tmp / "broken")
        receipt_of(broken).write_text("[]")
        argv = [str(broken) if a == "BROKEN" else a for a in argv]
    if "NOMANIFEST" in argv:
        cache = installed(bundle, tmp / "nomanifest")
        receipt_of(cache).write_text(json.dumps({"digest": "abc"}))
        argv = [str(cache) if a == "NOMANIFEST" else a for a in argv]
    if "INSTALLED" in argv:
        cache = installed(bundle, tmp / "c")
        argv = [str(cache) if a == "INSTALLED" else a for a in argv]
    if "MERGED" in argv:
        merged = tmp / "merged.tar.zst"
        kc("merge", str(bundle), str(bundle), "-o", str(merged), check=True)
        argv = [str(merged) if a == "MERGED" else a for a in argv]
    return [str(cache90) if a == "CACHE" else a for a in argv]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_input_is_one_line_with_its_exit_code(name, small_bundle, built, tmp_path):
    argv, env = case_setup(name, small_bundle, tmp_path)
    argv = _placeholders(argv, small_bundle, built[90][0], tmp_path)
    before = _outside_files(tmp_path)
    done = kc(*argv, env={"KERNELCACHE_NO_GPU_PROBE": "1", **env})
    code, words = EXPECTED[name]
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == code, (done.returncode, done.stderr[-600:])
    assert lines and words in lines[-1], lines
    if argv[0] not in ("pack", "build", "merge", "pull", "capture"):
        return
    assert _outside_files(tmp_path) == before  # a refused write leaves no file and no temp file behind


def _outside_files(root: Path) -> list[str]:
    """Every file under root except the ones the cases' own setup made in cache dirs."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not any(part in ("broken", "nomanifest", "c") for part in p.parts))


def test_pack_skips_compile_log_lines_that_are_not_records(built, tmp_path):
    cache, log, _ = built[90]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("5\n" + Path(log).read_text() + '"a string"\n')
    kc("pack", str(cache), "-o", str(tmp_path / "p.tar.zst"), "--compile-log", str(mixed), check=True)
    kernels = archive.read_manifest(tmp_path / "p.tar.zst").kernels
    assert kernels and all(k.constexprs is not None for k in kernels)  # the real records were all used


def test_sigterm_during_a_build_removes_its_scratch_dir(tmp_path):
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    env = clean_env(TMPDIR=str(scratch_root))
    child = subprocess.Popen([sys.executable, "-m", "kernelcache", *BUILD, "-o", str(tmp_path / "b")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(scratch_root.glob("kernelcache-build-*/*/jobs/*/worker.log")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert child.poll() is None, child.communicate()
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 128 + signal.SIGTERM and "Traceback" not in stderr, stderr[-2000:]
    assert list(scratch_root.glob("kernelcache-build-*")) == []  # its own scratch dir, with the workers' logs
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())
