"""A no-op install on every pod start: answered from the record of what an accepted install was checked
against (cachedir/checked.py), never when anything it rested on changed.

Each test runs the CLI as users do and reports which modules the command imported: the record's path
imports neither the installer nor the manifest nor zstandard; every change of the bundle file, the
installed files, the environment key, the GPUs or the cache's state takes the full path, which decides
(and refuses) exactly as before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bundles import rewrite
from helpers.common import ROOT, bare_venv, clean_env, entry_point

from kernelcache.errors import FingerprintMismatch

# What the record's path must not import (the installer's modules and click), and what it must not need. The full
# path is the installer's, still without click (entry.py runs a plain install itself; click only says an error).
WATCHED = ("kernelcache.install", "kernelcache.format.manifest", "zstandard", "click", "triton", "torch")
FULL = ["kernelcache.install", "kernelcache.format.manifest", "zstandard"]
# Nor these, which a Python start does not import and which cost a pod start most (1-10 ms each on 2 cores): what the
# answer needs is os, sys, _json and _sha2 and kernelcache's few fast-path modules.
STANDARD = ("collections", "contextlib", "functools", "re", "json", "hashlib", "importlib.util", "dataclasses",
            "pathlib", "typing", "subprocess", "kernelcache.errors")


def cli(*args: str, **env: str) -> tuple[dict, subprocess.CompletedProcess]:
    return entry_point(*args, watched=WATCHED, **env)


def install(bundle: Path, cache: Path, *flags: str, **env: str) -> tuple[dict, subprocess.CompletedProcess]:
    return cli("install", str(bundle), "--cache-dir", str(cache), *flags, **env)


@pytest.fixture
def installed(small_bundle, tmp_path) -> tuple[Path, Path]:
    """A copy of the small bundle, installed once (so the record is there): (bundle, cache dir)."""
    bundle = tmp_path / "b.tar.zst"
    shutil.copy(small_bundle, bundle)
    first, done = install(bundle, tmp_path / "c")
    assert first["exit"] == 0 and "installed" in done.stdout, done.stderr
    return bundle, tmp_path / "c"


def records(cache: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cache / ".kernelcache" / "checked").glob("*.json"))]


def test_a_noop_install_is_answered_without_the_installer(installed):
    bundle, cache = installed
    again, done = install(bundle, cache)
    assert again == {"exit": 0, "imported": []}, done.stderr
    assert done.stdout.startswith(f"already installed in {cache} (digest ")
    [record] = records(cache)
    assert record["bundle"] == str(bundle.resolve()) and record["files"]


def test_a_noop_install_imports_no_more_of_the_standard_library_than_it_needs(small_bundle, tmp_path):
    """Both forms users copy into an init container, ``install B`` and ``install B --gpu h200``, as an image runs them
    (no editable install's import finder, which imports those modules at every start)."""
    python, bundle = bare_venv(tmp_path / "venv"), tmp_path / "b.tar.zst"
    shutil.copy(small_bundle, bundle)
    args = ("install", str(bundle), "--cache-dir", str(tmp_path / "c"))
    first, done = entry_point(*args, watched=STANDARD, python=python, PYTHONPATH=str(ROOT))
    assert first["exit"] == 0 and {"json", "re"} <= set(first["imported"]), done.stderr  # the full path: watched
    for flags in ((), ("--gpu", "h200")):
        again, done = entry_point(*args, *flags, watched=STANDARD, python=python, PYTHONPATH=str(ROOT))
        assert again == {"exit": 0, "imported": []}, (flags, done.stderr)
        assert done.stdout.startswith(f"already installed in {tmp_path / 'c'} (digest "), done.stdout


def test_a_noop_install_for_a_gpu_or_arch_is_answered_from_the_record_too(installed):
    """The init-container form (``--gpu NAME``, no GPU visible): the record keeps the profiles and archs that take
    the bundle; another profile, an unknown one or an unknown arch takes the full path, which refuses it."""
    bundle, cache = installed
    for flags in (["--gpu", "h200"], ["--gpu", "H100-SXM"], ["--arch", "sm_90"], ["--gpu", "h200", "--arch", "90"]):
        again, done = install(bundle, cache, *flags)
        assert again == {"exit": 0, "imported": []}, (flags, done.stderr)
        assert done.stdout.startswith(f"already installed in {cache} (digest ")
    [record] = records(cache)
    from kernelcache.plan.gpus import PROFILES

    assert record["fits"]["gpus"] == sorted(p.name for p in PROFILES.values() if p.arch == "sm_90")  # no SM count
    for flags, code, says in ((["--gpu", "b200"], 21, "not for --gpu b200"),
                              (["--gpu", "h900"], 2, "unknown GPU profile 'h900'"),
                              (["--arch", "sm_999"], 2, "--arch sm_999: unknown arch"),
                              (["--arch", "sm_100"], 21, "not for --arch sm_100")):
        refused, done = install(bundle, cache, *flags)
        assert refused["exit"] == code and says in done.stderr.strip().splitlines()[-2], (flags, done.stderr)


def test_its_json_is_the_installers(installed, tmp_path):
    bundle, cache = installed
    quick, done = install(bundle, cache, "--json")
    assert quick["imported"] == [], done.stderr
    shutil.copy(bundle, tmp_path / "other-name.tar.zst")  # no record for this path: the installer answers
    full, slow = install(tmp_path / "other-name.tar.zst", cache, "--json")
    assert full["imported"] == FULL, slow.stderr
    assert json.loads(done.stdout) == json.loads(slow.stdout)


def touch(bundle: Path, cache: Path) -> None:
    stat = bundle.stat()
    os.utime(bundle, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def remove_a_file(bundle: Path, cache: Path) -> None:
    victim = next(p for p in sorted(cache.rglob("*.json")) if ".kernelcache" not in p.parts)
    victim.unlink()


def leave_a_journal(bundle: Path, cache: Path) -> None:
    (cache / ".kernelcache" / "journal" / f"{'0' * 64}.json").write_text("torn")


def age_the_record(bundle: Path, cache: Path) -> None:
    [path] = sorted((cache / ".kernelcache" / "checked").glob("*.json"))
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "kernelcache": "0.0.1"}))


@pytest.mark.parametrize("change", [touch, remove_a_file, leave_a_journal, age_the_record])
def test_a_changed_file_or_state_takes_the_full_path(installed, change):
    bundle, cache = installed
    change(bundle, cache)
    again, done = install(bundle, cache)
    assert again == {"exit": 0, "imported": FULL}, done.stderr
    expect = "installed " if change is remove_a_file else "already installed"
    assert done.stdout.startswith(expect), done.stdout
    quick, done = install(bundle, cache)  # the full path accepted it and kept a new record
    assert quick == {"exit": 0, "imported": []}, done.stderr


def test_another_bundle_at_the_same_path_is_installed(installed, bundle90):
    bundle, cache = installed
    shutil.copy(bundle90, bundle)
    again, done = install(bundle, cache)
    assert again == {"exit": 0, "imported": FULL} and done.stdout.startswith("installed "), done.stderr


def test_a_key_variable_set_since_is_refused_despite_the_record(installed):
    """The record is never what decides a refusal: under another environment key the installer runs and
    refuses the bundle its record had accepted."""
    bundle, cache = installed
    refused, done = install(bundle, cache, TRITON_DEBUG="1")
    assert refused["exit"] == FingerprintMismatch.exit_code and set(FULL) <= set(refused["imported"]), done.stderr
    assert "env_vars" in done.stderr


def test_other_gpus_are_probed_again(installed):
    bundle, cache = installed
    again, done = install(bundle, cache, CUDA_VISIBLE_DEVICES="1")
    assert again == {"exit": 0, "imported": FULL}, done.stderr


def test_an_install_without_the_gpu_check_vouches_only_for_installs_without_it(small_bundle, tmp_path):
    cache = tmp_path / "c"
    first, done = install(small_bundle, cache, "--no-gpu-check")
    assert first["exit"] == 0, done.stderr
    assert install(small_bundle, cache, "--no-gpu-check")[0] == {"exit": 0, "imported": []}
    checked, done = install(small_bundle, cache)
    assert checked == {"exit": 0, "imported": FULL}, done.stderr
    assert install(small_bundle, cache)[0] == {"exit": 0, "imported": []}


def test_a_noop_from_the_record_says_the_installers_warnings_again(small_bundle, tmp_path):
    """A difference that only warns (torch) is said on every install, the record's answer included."""
    bundle = rewrite(small_bundle, tmp_path / "w.tar.zst", torch="0.0.1")
    first, full = install(bundle, tmp_path / "c")
    again, quick = install(bundle, tmp_path / "c")
    assert first["exit"] == 0 and "warning: torch" in full.stderr, full.stderr
    assert again == {"exit": 0, "imported": []} and quick.stderr.splitlines()[:-1] == full.stderr.splitlines()[:-1]


def test_a_forced_install_is_never_kept(small_bundle, tmp_path):
    bundle = rewrite(small_bundle, tmp_path / "f.tar.zst", triton="0.0.1")  # blocking: only --force installs it
    for _ in range(2):
        forced, done = install(bundle, tmp_path / "c", "--force")
        assert forced["exit"] == 0 and set(FULL) <= set(forced["imported"]) and "FORCED" in done.stderr, done.stderr
    assert records(tmp_path / "c") == []


def test_run_with_the_bundle_skips_the_installer(installed):
    bundle, cache = installed
    script = ("import json, sys; from kernelcache.cachedir import CacheDir; "
              "from kernelcache.runtime.env import prepare; "
              f"variables = prepare({str(bundle)!r}, CacheDir.at({str(cache)!r})); "
              "print(json.dumps([variables['TRITON_CACHE_DIR'], 'kernelcache.install' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True,
                          timeout=600)
    assert json.loads(done.stdout) == [str(cache), False], done.stderr


# -- the entry point's plain forms are click's ----------------------------------------------------------------

PLAIN = [
    ["install", "B"],
    ["install", "B", "--cache-dir", "D", "--json"],
    ["install", "--cache-dir=D", "B", "--no-gpu-check"],
    ["install", "B", "--cache-dir", "D1", "--cache-dir", "D2"],
    ["env"],
    ["env", "--json", "--cache-dir", "D"],
    ["run", "--", "cmd", "-x"],
    ["run", "--strict", "--cache-dir", "D", "--", "vllm", "serve", "m"],
    ["run", "cmd", "--cache-dir", "x"],
    ["run", "--bundle", "B", "--cache-dir", "D", "--", "cmd"],
    ["run", "--cache-dir=D", "cmd", "--", "y"],
    ["install", "B", "--require-signature", "--trusted-key", "K1", "--trusted-key=K2"],
    ["install", "B", "--gpu", "h200", "--cache-dir", "D"],
    ["install", "--arch=sm_90", "B", "--gpu", "h200"],
    ["run", "--bundle", "B", "--trusted-key", "K", "--require-signature", "cmd"],
]
NOT_PLAIN = [["install", "B", "--force"], ["install", "-h"], ["env", "--read-only"], ["env", "--json=1"],
             ["run", "--bundle"], ["inspect", "B"], ["--version"], []]


@pytest.mark.parametrize("args", PLAIN, ids=" ".join)
def test_a_plain_form_parses_as_click_parses_it(args, tmp_path, monkeypatch):
    from kernelcache.cli import main as cli
    from kernelcache.entry import _FORMS, parse

    monkeypatch.chdir(tmp_path)
    (tmp_path / "B").write_text("")  # run's --bundle must exist for click
    verb, options, positionals = parse(args)
    params = cli.commands[verb].make_context(verb, args[1:], help_option_names=["-h", "--help"]).params  # as main's
    names = {"--cache-dir": "cache_dir", "--json": "as_json", "--no-gpu-check": "no_gpu_check", "--bundle": "bundle",
             "--require-signature": "require_signature", "--trusted-key": "trusted_keys", "--gpu": "gpu",
             "--arch": "arch", "--strict": "strict"}
    for flag, value in options.items():
        assert params[names[flag]] == (tuple(value) if isinstance(value, list) else value), flag
    assert all(params[names[f]] in (None, False, ()) for f in _FORMS[verb] if f not in options)
    expect = list(params["command"]) if verb == "run" else [params["bundle"]] if verb == "install" else []
    assert positionals == expect


@pytest.mark.parametrize("args", NOT_PLAIN, ids=" ".join)
def test_anything_else_goes_to_click(args):
    from kernelcache.entry import parse

    assert parse(args) is None


def test_env_and_run_start_without_click(installed):
    """The import log of the kernelcache process itself (run execs /bin/true, which imports nothing): the first
    env computes the variables (runtime/env.py), run takes them from what it kept (runtime/served.py)."""
    bundle, cache = installed
    for args in (["env", "--cache-dir", str(cache)], ["run", "--bundle", str(bundle), "--cache-dir", str(cache),
                                                      "--", "/bin/true"]):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "kernelcache", *args], env=clean_env(),
                              capture_output=True, text=True, timeout=600)
        imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
        computed = "kernelcache.runtime.env" in imported
        assert done.returncode == 0 and "kernelcache.entry" in imported, done.stderr[-2000:]
        assert computed == (args[0] == "env") and "kernelcache.runtime.served" in imported, args
        assert not imported & {"click", "kernelcache.install", "zstandard"}, args
