"""A served process takes what ``ptxas --version``, ``ldconfig -p`` and ``file -b <interpreter>`` print from the
install's record, only while the files that decide it are the recorded ones (hooks/kernelcache_outputs.py).

Triton runs those commands in every process before its first compile or cache lookup (``file`` through CPython's
``platform.architecture()``, which Triton's ``platform_key()`` calls). The unit tests use a real executable named
``ptxas`` in a temp dir (a shell script, so a test can rewrite it) and this machine's real ``file`` on a copy of a
real ELF binary; the served tests use the lab venv's real Triton, its real ptxas, this machine's ldconfig and
``file``.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import clean_env, kc

from kernelcache.hooks import kernelcache_outputs as ko


def tool(folder: Path, text: str, name: str = "ptxas") -> Path:
    path = folder / name
    path.write_text(f"#!/bin/sh\nprintf '{text}\\n'\n")
    path.chmod(0o755)
    return path


class Spawns:
    """The commands this process starts (the ``subprocess.Popen`` audit event), while counting."""

    seen: list[list[str]] = []
    counting = False

    @classmethod
    def hook(cls, event, args):
        if cls.counting and event == "subprocess.Popen":
            cls.seen.append([str(a) for a in args[1]])

    def __enter__(self):
        Spawns.seen, Spawns.counting = [], True
        return Spawns.seen

    def __exit__(self, *exc):
        Spawns.counting = False


sys.addaudithook(Spawns.hook)


@pytest.mark.fast
def test_a_kept_output_is_returned_without_running_the_command(tmp_path):
    ptxas = tool(tmp_path, "release 12.8, V12.8.93")
    argv = [str(ptxas), "--version"]
    ko.keep(str(tmp_path / "keys"), [argv])
    proxy = ko.KeptOutputs(str(tmp_path / "keys"))
    with Spawns() as seen:
        got = proxy.check_output(argv, stderr=subprocess.STDOUT)  # as knobs.NvidiaTool.from_path asks
        again = proxy.check_output(argv)  # as get_ptxas_version asks
    assert seen == [] and got == again == subprocess.check_output(argv)
    with Spawns() as seen:
        assert proxy.check_output(argv, text=True) == "release 12.8, V12.8.93\n"  # another form: the real run
    assert seen == [argv]


@pytest.mark.fast
@pytest.mark.parametrize("change", ["rewrite the binary", "replace the binary", "another locale", "corrupt record",
                                    "record names another file"])
def test_any_change_runs_the_command_again(tmp_path, monkeypatch, change):
    ptxas = tool(tmp_path, "release 12.8")
    argv, folder = [str(ptxas), "--version"], str(tmp_path / "keys")
    ko.keep(folder, [argv])
    record = tmp_path / "keys" / ko.RECORD
    if change == "rewrite the binary":  # same size, new bytes, the old mtime: only ctime tells
        st = ptxas.stat()
        ptxas.write_text(ptxas.read_text().replace("12.8", "12.9"))
        os.utime(ptxas, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "replace the binary":
        tool(tmp_path, "release 13.0")
    elif change == "another locale":
        monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    elif change == "corrupt record":
        record.write_text('{"outputs": [')
    else:
        data = json.loads(record.read_text())
        data["outputs"][0]["files"] = {str(tmp_path / "other"): [1, 2, 3]}
        record.write_text(json.dumps(data))
    with Spawns() as seen:
        got = ko.KeptOutputs(folder).check_output(argv)
    assert seen == [argv] and got == subprocess.check_output(argv)


@pytest.mark.fast
def test_keep_reruns_only_what_changed_and_never_keeps_a_failure_or_stderr(tmp_path):
    good, noisy = tool(tmp_path, "release 12.8"), tmp_path / "ptxas-noisy"
    noisy.write_text("#!/bin/sh\necho 'release 12.8'\necho warning >&2\n")
    noisy.chmod(0o755)
    failing = tmp_path / "ptxas-failing"
    failing.write_text("#!/bin/sh\necho 'release 12.8'\nexit 3\n")
    failing.chmod(0o755)
    commands = [[str(p), "--version"] for p in (good, noisy, failing)] + [["/bin/echo", "not a tool query"]]
    folder = str(tmp_path / "keys")
    with Spawns() as seen:
        ko.keep(folder, commands)
    # (run side by side: in any order) the echo is not a command whose output may be kept: never run
    assert sorted(seen) == sorted(commands[:3])
    assert list(ko.load(folder)) == [tuple(commands[0])]
    with Spawns() as seen:
        ko.keep(folder, commands)
    assert sorted(seen) == sorted(commands[1:3])  # the kept one holds; the others are tried again


def file_target(folder: Path) -> tuple[Path, list[str]]:
    """A real ELF binary of our own (a copy of ``true``, so a test may rewrite it) and ``file``'s question about it."""
    target = folder / "true-copy"
    shutil.copy2(shutil.which("true"), target)
    return target, [ko.FILE, "-b", str(target)]


needs_file = pytest.mark.skipif(shutil.which("file") is None, reason="no `file` on PATH")


@pytest.mark.fast
@needs_file
def test_files_answer_is_kept_and_platform_gets_it_without_running_file(tmp_path, monkeypatch):
    target, argv = file_target(tmp_path)
    folder = str(tmp_path / "keys")
    with Spawns() as seen:
        ko.keep(folder, [argv])
    assert [c[1:] for c in seen] == [["--version"], ["-b", str(target)]]  # where its magic is, then the question
    [entry] = ko.load(folder).values()
    assert entry["binary"] == os.path.realpath(shutil.which("file")) and str(target) in entry["files"]
    assert any(path.endswith(".mgc") for path in entry["files"])  # its magic database, compiled or not
    real = platform._syscmd_file(str(target))
    assert real.startswith("ELF")
    monkeypatch.setattr(platform, "_syscmd_file", platform._syscmd_file)  # undone after the test
    ko.seed_platform(None, folder)
    with Spawns() as seen:
        assert platform._syscmd_file(str(target)) == real
        assert platform.architecture(str(target)) == ("64bit", "ELF")
    assert seen == []
    with Spawns() as seen:  # a question nobody kept: asked as platform asks it
        assert platform._syscmd_file(shutil.which("true")) == real
    assert seen == [["file", "-b", os.path.realpath(shutil.which("true"))]]


@pytest.mark.fast
@needs_file
@pytest.mark.parametrize("change", ["rewrite the target", "another file first on PATH", "MAGIC set",
                                    "a magic file appears"])
def test_any_change_asks_file_again(tmp_path, monkeypatch, change):
    target, argv = file_target(tmp_path)
    folder = str(tmp_path / "keys")
    ko.keep(folder, [argv])
    [entry] = ko.load(folder).values()
    if change == "rewrite the target":  # same size, other bytes, the old mtime: only ctime tells
        st = target.stat()
        target.write_bytes(b"#!/bin/sh\n".ljust(st.st_size, b"#"))
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "another file first on PATH":
        tool(tmp_path, "a shell script", name="file")
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    elif change == "MAGIC set":
        monkeypatch.setenv("MAGIC", "/usr/share/misc/magic")
    else:
        absent = [path for path, stat in entry["files"].items() if stat is None]
        assert absent  # libmagic reads <name>.mgc, else <name>: one of each pair is absent here
        monkeypatch.setitem(entry["files"], absent[0], [1, 2, 3])  # as if it had been there when kept
        Path(folder, ko.RECORD).write_text(json.dumps({"outputs": [entry]}))
    with Spawns() as seen:
        assert ko.KeptOutputs(folder).kept_file(str(target)) is None
    assert seen == []  # refused: platform then asks file itself


PROBE = r"""
import json, sys
spawned = []
sys.addaudithook(lambda e, a: spawned.append([str(x) for x in a[1]]) if e == "subprocess.Popen" else None)
from triton import knobs
from triton.backends.nvidia import compiler, driver
import platform, triton.runtime.build as build
out = {"release": knobs.nvidia.ptxas.version, "text": compiler.get_ptxas_version(90),
       "platform_key": build.platform_key()}
try:
    out["libcuda_dirs"] = driver.libcuda_dirs()
except AssertionError as exc:  # no GPU driver here: Triton's own message, after reading ldconfig -p
    out["libcuda_dirs"] = str(exc)
print(json.dumps({**out, "spawned": spawned}))
"""


def probe(*prefix: str, env: dict | None = None) -> dict:
    done = subprocess.run([*prefix, sys.executable, "-c", PROBE], env=env or clean_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def served(cache: Path) -> dict:
    return probe(sys.executable, "-m", "kernelcache", "run", "--cache-dir", str(cache), "--")


def test_a_served_process_runs_no_tool_query_and_sees_what_triton_would(bundle90, tmp_path):
    cache = tmp_path / "c"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    plain, seeded = probe(), served(cache)
    assert any(cmd[-1] == "--version" for cmd in plain["spawned"])  # the real process runs them: what is seen is real
    assert ["/sbin/ldconfig", "-p"] in plain["spawned"]
    if shutil.which("file"):
        assert ["file", "-b", platform._follow_symlinks(sys.executable)] in plain["spawned"]
        assert plain["platform_key"].endswith(",64bit,ELF")
    assert seeded == {**plain, "spawned": []}


def test_a_record_whose_files_no_longer_hold_is_not_used(bundle90, tmp_path):
    """A Triton upgrade brings a new ptxas (new stat): the served process runs it, whatever the record says."""
    cache = tmp_path / "c"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    record = cache / ".kernelcache" / "triton-keys" / ko.RECORD
    data = json.loads(record.read_text())
    for entry in data["outputs"]:
        entry["stdout"] = "Cuda compilation tools, release 99.9, V99.9\n"  # a lie, believed only while files hold
    record.write_text(json.dumps(data))
    assert served(cache)["release"] == "99.9"
    for entry in data["outputs"]:
        for stat in entry["files"].values():
            if stat is not None:  # (a magic file file's record names as absent)
                stat[2] += 1  # what an upgrade in place looks like: the files' ctimes move
    record.write_text(json.dumps(data))
    seeded, plain = served(cache), probe()
    assert seeded == plain and seeded["release"] != "99.9"
