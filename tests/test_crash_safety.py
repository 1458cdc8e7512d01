"""SIGKILL an install at many points; the cache is never corrupt and the next command completes it.

Each kill runs a real install of a real bundle (the 21 test kernels and 6 modules) in a forked
process and kills it with SIGKILL, at one of two kinds of points:

* the N-th file-system operation of the install (``open``, ``mkdir``, ``rename``, ``unlink``,
  ``rmtree``, ...), seen through a Python audit hook in the child, which SIGKILLs itself just
  before that operation runs; N is drawn with a seeded RNG over the whole install and, separately,
  over its publish window (between the journal and the receipt), where kills matter most;
* a seeded random time after the install started, sent by the parent (an outside kill).

What is checked after every kill (docs/RELIABILITY.md states the guarantee):

* no entry is ever partial, as a Triton reader would see it;
* the receipt exists only if every entry is complete;
* a subset of complete entries is visible only while a journal says how to finish it;
* ``recover()`` (which install, env, run and activate call first) leaves all of it or none of it,
  and no staging dir, journal or temporary file;
* the next install then completes, and every file holds the bundle's bytes.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import select
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers.cachecheck import bundle_state, expected_bytes, has_receipt, leftovers

from kernelcache.cachedir import CacheDir, recover
from kernelcache.format import archive
from kernelcache.install import InstallPlan

FS_EVENTS = {"open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "os.scandir", "os.listdir",
             "fcntl.flock"}
SEED = 6
EVENT_KILLS_ANYWHERE = 30
EVENT_KILLS_IN_PUBLISH = 25
TIMED_KILLS = 15


def _child(run, kill_at: int | None, report_fd: int, interrupt: bool = False) -> None:
    """In the forked child: count file-system events, SIGKILL self before event ``kill_at`` (or, with
    ``interrupt``, raise KeyboardInterrupt there: unlike SIGKILL it unwinds every ``finally``)."""
    trace: list[tuple[str, str]] = []

    def hook(event: str, args: tuple) -> None:
        if event in FS_EVENTS:
            trace.append((event, str(args[0]) if args else ""))
            if kill_at is not None and len(trace) == kill_at:
                if interrupt:
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signal.SIGKILL)

    os.write(report_fd, b"S")  # started: the timed kills count from here
    sys.addaudithook(hook)
    try:
        run()
    except BaseException as exc:  # noqa: BLE001 -- reported to the parent, which fails the test
        if interrupt and isinstance(exc, KeyboardInterrupt):  # the interrupt it was asked for
            os.write(report_fd, json.dumps({"interrupted": True}).encode())
            os._exit(0)
        os.write(report_fd, json.dumps({"error": repr(exc)}).encode())
        os._exit(3)
    os.write(report_fd, json.dumps({"trace": trace}).encode())
    os._exit(0)


def fork_run(run, kill_at: int | None = None, kill_after: float | None = None,
             interrupt: bool = False) -> tuple[int, dict]:
    """Run ``run`` in a forked child; returns (how it ended, its report). 'killed' or 'exit 0'."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(run, kill_at, write_fd, interrupt)
    os.close(write_fd)
    assert os.read(read_fd, 1) == b"S"
    if kill_after is not None:
        time.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)
    chunks = []
    while select.select([read_fd], [], [], 60)[0] and (chunk := os.read(read_fd, 1 << 20)):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    report = json.loads(b"".join(chunks) or b"{}")
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return "killed", report
    assert os.WEXITSTATUS(status) == 0, report
    return "exit 0", report


@pytest.fixture(scope="module")
def subject(bundle90):
    # The lock imports filelock on first use. Loaded here, in the parent, every forked child runs the same
    # sequence of file-system events (the first recover() in the parent would load it otherwise).
    importlib.import_module("filelock")
    manifest = archive.read_manifest(bundle90)
    return bundle90, manifest, expected_bytes(bundle90)


def make_plan(bundle: Path, manifest, cache: Path) -> InstallPlan:
    return InstallPlan(bundle, manifest, archive.bundle_digest(manifest), cache)


def kill_points(subject, tmp_path) -> tuple[list[tuple[str, float]], dict]:
    """A dry run counts the install's events; seeded draws pick where to kill."""
    bundle, manifest, _ = subject
    started = time.perf_counter()
    ended, report = fork_run(make_plan(bundle, manifest, tmp_path / "dry").execute)
    duration = time.perf_counter() - started
    assert ended == "exit 0"
    trace = report["trace"]
    journal = next(i for i, (e, a) in enumerate(trace, 1) if e == "os.rename" and "/journal/" in a)
    receipt = next(i for i, (e, a) in enumerate(trace, 1) if e == "os.rename" and a.endswith(".pending"))
    rng = random.Random(SEED)
    points = [("event", rng.randint(1, len(trace))) for _ in range(EVENT_KILLS_ANYWHERE)]
    points += [("event", rng.randint(journal + 1, receipt)) for _ in range(EVENT_KILLS_IN_PUBLISH)]
    points += [("time", rng.uniform(0, duration)) for _ in range(TIMED_KILLS)]
    return points, {"events": len(trace), "publish_window": (journal + 1, receipt), "seconds": duration}


def test_sigkill_at_random_points_never_corrupts_and_the_next_install_completes(subject, tmp_path):
    bundle, manifest, expected = subject
    points, dry = kill_points(subject, tmp_path)
    assert len(points) >= 50
    seen: dict[str, int] = {}
    for i, (kind, where) in enumerate(points):
        cache = tmp_path / f"k{i}" / "cache"
        plan = make_plan(bundle, manifest, cache)
        if kind == "event":
            ended, _ = fork_run(plan.execute, kill_at=where)
        else:
            ended, _ = fork_run(plan.execute, kill_after=where)
        after_kill = bundle_state(cache, manifest, expected) if cache.exists() else "none"
        left = leftovers(cache) if cache.exists() else {"journal": []}
        if has_receipt(cache, manifest):
            assert after_kill == "all"
        if after_kill == "subset":
            assert left["journal"], f"kill {i}: a subset is visible with no journal to finish it"
        key = f"{ended}: {after_kill}" + (" + journal" if left["journal"] else "")
        seen[key] = seen.get(key, 0) + 1

        if cache.exists():
            recover(CacheDir(cache))
            assert bundle_state(cache, manifest, expected) == ("all" if left["journal"] else after_kill)
            assert leftovers(cache) == {"staging": [], "journal": [], "temp": []}
        make_plan(bundle, manifest, cache).execute()
        assert bundle_state(cache, manifest, expected) == "all"
        assert has_receipt(cache, manifest)
        assert leftovers(cache) == {"staging": [], "journal": [], "temp": []}

    (tmp_path / "kills.json").write_text(json.dumps({"dry_run": dry, "outcomes": seen}, indent=1))
    assert sum(seen.values()) == len(points)
    assert sum(n for k, n in seen.items() if k.startswith("killed")) >= 50, seen
    assert any("subset + journal" in k for k in seen), seen  # the publish window was really hit


def test_kills_during_recovery_itself_still_converge(subject, tmp_path):
    """Kill an install mid-publish, then kill each roll-forward too; the first one left alone finishes."""
    bundle, manifest, expected = subject
    points, dry = kill_points(subject, tmp_path)
    start, end = dry["publish_window"]
    rng = random.Random(SEED + 1)
    for round_ in range(5):
        cache = tmp_path / f"r{round_}" / "cache"
        ended, _ = fork_run(make_plan(bundle, manifest, cache).execute, kill_at=rng.randint(start + 1, end - 1))
        assert ended == "killed"
        assert leftovers(cache)["journal"]
        for _ in range(3):
            fork_run(lambda cache=cache: recover(CacheDir(cache)), kill_at=rng.randint(1, 40))
            bundle_state(cache, manifest, expected)  # never partial, whatever the state
        recover(CacheDir(cache))
        assert bundle_state(cache, manifest, expected) == "all" and has_receipt(cache, manifest)
        assert leftovers(cache) == {"staging": [], "journal": [], "temp": []}


def test_env_finishes_an_interrupted_install(subject, tmp_path):
    """The next kernelcache command of any kind rolls forward: here `kernelcache env`."""
    from helpers.common import kc

    bundle, manifest, expected = subject
    _, dry = kill_points(subject, tmp_path)
    start, end = dry["publish_window"]
    cache = tmp_path / "cache"
    ended, _ = fork_run(make_plan(bundle, manifest, cache).execute, kill_at=(start + end) // 2)
    assert ended == "killed" and bundle_state(cache, manifest, expected) == "subset"
    kc("env", "--cache-dir", str(cache), check=True)
    assert bundle_state(cache, manifest, expected) == "all"
    assert leftovers(cache) == {"staging": [], "journal": [], "temp": []}


def test_an_exception_while_publishing_keeps_what_the_roll_forward_needs(subject, tmp_path):
    """Ctrl-C (or SIGTERM in build, capture and verify) unwinds ``finally`` blocks, unlike SIGKILL."""
    bundle, manifest, expected = subject
    _, dry = kill_points(subject, tmp_path)
    start, end = dry["publish_window"]
    for at in sorted({start, (start + end) // 2, end - 1}):
        cache = tmp_path / f"cache-{at}"
        ended, report = fork_run(make_plan(bundle, manifest, cache).execute, kill_at=at, interrupt=True)
        assert ended == "exit 0" and report == {"interrupted": True}
        assert bundle_state(cache, manifest, expected) in ("none", "subset", "all")  # never partial
        recover(CacheDir(cache))
        assert bundle_state(cache, manifest, expected) == "all" and has_receipt(cache, manifest), at
        assert leftovers(cache) == {"staging": [], "journal": [], "temp": []}
