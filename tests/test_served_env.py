"""`env` and `run` on every pod start: answered from what the last computation kept (runtime/served.py), never
when anything it rested on changed.

Each test runs the command as its console script does and reports whether the full computation
(runtime/env.py) ran. A record whose variables were altered by hand shows whether it is believed: its marker
is printed while every stamp holds, and is gone after each change below, which the full computation decides
as before (rolling a journal forward, refusing what it refuses).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import clean_env, entry_point

MARKER = "KERNELCACHE_TEST_MARKER"


def env(cache: Path, **variables: str) -> tuple[dict, dict, subprocess.CompletedProcess]:
    """(variables printed, {exit, full}, the process) of ``kernelcache env --cache-dir cache --json``."""
    report, done = probe("env", "--cache-dir", str(cache), "--json", **variables)
    return (json.loads(done.stdout) if report["exit"] == 0 else {}), report, done


def probe(*args: str, **variables: str) -> tuple[dict, subprocess.CompletedProcess]:
    """({exit, full}, the process): full says whether the full computation (runtime/env.py) ran."""
    found, done = entry_point(*args, watched=("kernelcache.runtime.env",), **variables)
    return {"exit": found["exit"], "full": found["imported"] == ["kernelcache.runtime.env"]}, done


def install(bundle: Path, cache: Path, *flags: str, **variables: str) -> None:
    subprocess.run([sys.executable, "-m", "kernelcache", "install", str(bundle), "--cache-dir", str(cache), *flags],
                   env=clean_env(**variables), check=True, capture_output=True)


def records(cache: Path) -> list[Path]:
    return sorted((cache / ".kernelcache" / "served").glob("*.json"))


def mark(cache: Path) -> None:
    """Alter the kept variables: printed only if the record is believed."""
    for path in records(cache):
        record = json.loads(path.read_text())
        record["variables"][MARKER] = "1"
        path.write_text(json.dumps(record))


@pytest.fixture
def served(small_bundle, tmp_path) -> Path:
    """The small bundle installed into a cache dir, `env` computed once (so the record is there), then marked."""
    cache = tmp_path / "c"
    install(small_bundle, cache, "--no-gpu-check")
    variables, report, done = env(cache)
    assert report == {"exit": 0, "full": True} and variables["TRITON_CACHE_DIR"] == str(cache), done.stderr
    assert len(records(cache)) == 1
    mark(cache)
    return cache


def test_the_next_env_is_the_record(served):
    variables, report, done = env(served)
    assert report == {"exit": 0, "full": False}, done.stderr
    assert variables[MARKER] == "1" and variables["TRITON_CACHE_DIR"] == str(served)


def exports(cache: Path) -> tuple[str, bool]:
    report, done = probe("env", "--cache-dir", str(cache))
    assert report["exit"] == 0, done.stderr
    return done.stdout, report["full"]


def test_its_answer_is_the_full_computations(small_bundle, tmp_path):
    cache = tmp_path / "c"
    install(small_bundle, cache, "--no-gpu-check")
    full, first, _ = env(cache)
    quick, second, _ = env(cache)
    assert (first["full"], second["full"]) == (True, False) and quick == full
    assert exports(cache) == (exports(cache)[0], False)
    quick_exports = exports(cache)[0]
    shutil.rmtree(cache / ".kernelcache" / "served")
    assert exports(cache) == (quick_exports, True)


def install_another_bundle(cache: Path, bundle90: Path) -> None:
    install(bundle90, cache, "--no-gpu-check")


def drop_the_triton_keys(cache: Path, bundle90: Path) -> None:
    shutil.rmtree(cache / ".kernelcache" / "triton-keys")


def add_a_flashinfer_file(cache: Path, bundle90: Path) -> None:
    (cache / "flashinfer" / "x").mkdir(parents=True)


def leave_a_journal(cache: Path, bundle90: Path) -> None:
    (cache / ".kernelcache" / "journal" / f"{'0' * 64}.json").write_text("torn")


def leave_a_staging_dir(cache: Path, bundle90: Path) -> None:
    (cache / ".kernelcache" / "staging" / "left").mkdir(parents=True)


def install_a_package(cache: Path, bundle90: Path) -> None:
    """A directory on sys.path (PYTHONPATH, the same value before and after) gets a new package."""
    (cache.parent / "site" / "newpkg").mkdir()


def make_home_unwritable(cache: Path, bundle90: Path) -> None:
    """FlashInfer's workspace choice changes: $HOME/.cache becomes a file."""
    (cache.parent / "home" / ".cache").write_text("")


def age_the_record(cache: Path, bundle90: Path) -> None:
    [path] = records(cache)
    record = json.loads(path.read_text())
    record["inputs"]["kernelcache"] = "0.0.1"
    path.write_text(json.dumps(record))


CHANGES = [install_another_bundle, drop_the_triton_keys, add_a_flashinfer_file, leave_a_journal,
           leave_a_staging_dir, install_a_package, make_home_unwritable, age_the_record]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.__name__)
def test_any_change_it_rested_on_takes_the_full_computation(small_bundle, bundle90, tmp_path, change):
    cache, site, home = tmp_path / "c", tmp_path / "site", tmp_path / "home"
    site.mkdir()
    home.mkdir()
    fixed = {"PYTHONPATH": str(site), "HOME": str(home)}
    install(small_bundle, cache, "--no-gpu-check", **fixed)
    env(cache, **fixed)
    mark(cache)
    assert env(cache, **fixed)[0][MARKER] == "1"
    change(cache, bundle90)
    variables, report, done = env(cache, **fixed)
    assert report == {"exit": 0, "full": True} and MARKER not in variables, done.stderr
    if change is drop_the_triton_keys:
        assert "KERNELCACHE_TRITON_KEYS" not in variables
    if change in (leave_a_journal, leave_a_staging_dir):  # the full path finished (swept) what was left
        assert not any(any((cache / ".kernelcache" / sub).iterdir()) for sub in ("journal", "staging"))
    again, report, _ = env(cache, **fixed)  # the full computation kept a new record
    assert report == {"exit": 0, "full": False} and again == variables


def test_other_inputs_have_their_own_record(served, tmp_path):
    for variables in ({"PYTHONPATH": str(tmp_path)}, {"FLASHINFER_DISABLE_JIT": "0"}, {"HOME": str(tmp_path)}):
        found, report, done = env(served, **variables)
        assert report == {"exit": 0, "full": True} and MARKER not in found, (variables, done.stderr)
    assert len(records(served)) == 4


def test_a_bad_record_is_computed_again(served):
    [path] = records(served)
    for text in ("{", "[]", json.dumps({"inputs": 1}), path.read_text().replace('"1"', "1")):
        path.write_text(text)
        variables, report, done = env(served)
        assert report == {"exit": 0, "full": True} and MARKER not in variables, (text, done.stderr)
        mark(served)


def test_a_change_while_they_are_computed_keeps_no_record(small_bundle, tmp_path):
    """The stamps are taken before the variables are computed: an install that lands meanwhile (its receipt renamed
    into installed/) leaves nothing that would vouch for variables computed without it."""
    from kernelcache.runtime.served import find_served, remember_served, snapshot

    cache = tmp_path / "c"
    install(small_bundle, cache, "--no-gpu-check")
    variables = {"TRITON_CACHE_DIR": str(cache)}
    before = snapshot(cache)
    os.utime(cache / ".kernelcache" / "installed")
    remember_served(cache, variables, before)
    assert records(cache) == [] and find_served(cache) is None
    remember_served(cache, variables, snapshot(cache))
    assert len(records(cache)) == 1 and find_served(cache) == variables


def test_run_is_answered_from_the_records(small_bundle, tmp_path):
    """`run` execs with the kept variables (the marker reaches the command), with --bundle only when the
    bundle's own record (cachedir/checked.py) holds too; the kernelcache process imports no computation."""
    bundle, cache = tmp_path / "b.tar.zst", tmp_path / "c"
    shutil.copy(small_bundle, bundle)
    install(bundle, cache)
    subprocess.run([sys.executable, "-m", "kernelcache", "env", "--cache-dir", str(cache)], env=clean_env(),
                   check=True, capture_output=True)  # as run starts: the record is per interpreter and sys.path
    mark(cache)
    show = [sys.executable, "-c", f"import os; print(os.environ.get({MARKER!r}))"]
    for extra in ([], ["--bundle", str(bundle)]):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "kernelcache", "run", *extra, "--cache-dir",
                               str(cache), "--", *show], env=clean_env(), capture_output=True, text=True,
                              timeout=600)
        imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
        assert done.stdout.strip() == "1", done.stderr[-2000:]
        assert not imported & {"kernelcache.runtime.env", "kernelcache.cachedir.state", "click"}, extra
    stat = bundle.stat()  # the bundle file changed (its ctime): its record no longer holds, the installer decides
    os.utime(bundle, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    done = subprocess.run([sys.executable, "-m", "kernelcache", "run", "--bundle", str(bundle), "--cache-dir",
                           str(cache), "--", *show], env=clean_env(), capture_output=True, text=True, timeout=600)
    assert done.stdout.strip() == "None", done.stderr


def test_a_missing_command_is_said_as_before(served):
    done = subprocess.run([sys.executable, "-m", "kernelcache", "run", "--cache-dir", str(served), "--",
                           "no-such-command-here"], env=clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "command not found: 'no-such-command-here'" in done.stderr


def test_the_stamped_flashinfer_dir_is_where_bundles_put_modules():
    from kernelcache.cachedir.layout import FLASHINFER_MODULES_DIR
    from kernelcache.format.manifest import FLASHINFER_ROOT

    assert FLASHINFER_MODULES_DIR == FLASHINFER_ROOT
