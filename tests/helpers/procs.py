"""Processes the concurrency tests start: ``python tests/helpers/procs.py COMMAND ARGS...``.

``install BUNDLE CACHE GO``: warm up (imports, the Triton fingerprint), say so with a file
``GO.ready.<pid>``, wait until the file GO exists so that every process starts installing at once,
run ``kernelcache install`` (the CLI's own ``main``), then read the cache back as a Triton reader
would and print one JSON line.

``read BUNDLE POINTER STOP OUT``: a Triton process that, until STOP exists, keeps looking up every
kernel of BUNDLE with Triton's own ``FileCacheManager`` in the cache dir named by the file POINTER
(which the test moves from one install to the next) and counts what it finds: absent, complete,
or partial (a group file whose children are missing or differ from the bundle). Writes OUT.

``rm CACHE NAME GO``: as ``install``, for ``kernelcache rm NAME`` (its JSON printed).

``watch KEPT OTHERS POINTER STOP OUT``: as ``read``, over the kernels of the bundle KEPT and of the bundles OTHERS
(comma-separated), while entries are also removed: a lookup cut short because its entry dir was renamed away
meanwhile (the dir at that path is another one, or none) is ``vanished``, not partial; a kernel of KEPT found
absent or vanished is a problem (it must never go missing).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def install(bundle: str, cache: str, go: str) -> int:
    from helpers.cachecheck import bundle_state, expected_bytes

    from kernelcache.cli import main
    from kernelcache.format import archive
    from kernelcache.format.fingerprint import local_environment

    manifest = archive.read_manifest(bundle)
    local_environment(manifest.environment.ptxas or [manifest.target.arch])
    expected = expected_bytes(Path(bundle))
    Path(f"{go}.ready.{os.getpid()}").touch()
    while not os.path.exists(go):
        time.sleep(0.002)
    try:
        main(["install", bundle, "--cache-dir", cache, "--no-gpu-check", "--json"], standalone_mode=False)
    except SystemExit as exc:
        return int(exc.code or 0)
    sys.stdout.flush()
    print(json.dumps({"state": bundle_state(Path(cache), manifest, expected), "pid": os.getpid()}))
    return 0


def rm(cache: str, name: str, go: str) -> int:
    import kernelcache.manage  # noqa: F401 -- warmed up before the start
    from kernelcache.cli import main

    Path(f"{go}.ready.{os.getpid()}").touch()
    while not os.path.exists(go):
        time.sleep(0.002)
    try:
        main(["rm", name, "--cache-dir", cache, "--json"], standalone_mode=False)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def watch(kept: str, others: str, pointer: str, stop: str, out: str) -> int:
    import triton
    from triton.runtime.cache import FileCacheManager

    from kernelcache.format import archive

    must_stay = {k.key: k for k in archive.read_manifest(kept).kernels}
    expected = {name: data for b in [kept, *others.split(",")] for _, name, data in archive.iter_members(b)}
    kernels = {k.key: k for b in others.split(",") for k in archive.read_manifest(b).kernels} | must_stay
    counts = {"absent": 0, "complete": 0, "partial": 0, "vanished": 0, "snapshots": 0, "kept_complete": 0}
    problems: list[str] = []
    while not os.path.exists(stop):
        cache = pointer_target(pointer)
        if not cache:
            time.sleep(0.01)
            continue
        triton.knobs.cache.dir = cache
        for key, kernel in kernels.items():
            state = stable_lookup(FileCacheManager(key), kernel, expected, problems, Path(cache) / key)
            counts[state] += 1
            if key in must_stay and state != "complete":
                problems.append(f"{key}: a kernel of the bundle that stays installed was {state}")
            counts["kept_complete"] += key in must_stay and state == "complete"
        counts["snapshots"] += 1
    Path(out).write_text(json.dumps({**counts, "problems": problems[:20], "problem_count": len(problems)}))
    return 0


def pointer_target(pointer: str) -> str:
    try:
        return Path(pointer).read_text().strip()
    except FileNotFoundError:
        return ""


def stable_lookup(manager, kernel, expected: dict[str, bytes], problems: list[str], entry: Path) -> str:
    """``lookup``, where a failure because the entry dir was renamed away meanwhile is ``vanished``: the dir at that
    path (by inode) is no longer the one the lookup started in. A partial entry stays in place, so its dir does not
    change."""
    before = _inode(entry)
    found: list[str] = []
    state = lookup(manager, kernel, expected, found)
    if state == "partial" and _inode(entry) != before:
        return "vanished"
    problems += found
    return state


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def read(bundle: str, pointer: str, stop: str, out: str) -> int:
    import triton
    from triton.runtime.cache import FileCacheManager

    from kernelcache.format import archive

    manifest = archive.read_manifest(bundle)
    expected = {name: data for _, name, data in archive.iter_members(bundle)}
    counts = {"absent": 0, "complete": 0, "partial": 0, "snapshots": 0, "mixed_snapshots": 0}
    problems: list[str] = []
    while not os.path.exists(stop):
        try:
            cache = Path(pointer).read_text().strip()
        except FileNotFoundError:
            continue
        if not cache:
            continue
        triton.knobs.cache.dir = cache
        states = [lookup(FileCacheManager(k.key), k, expected, problems) for k in manifest.kernels]
        for state in states:
            counts[state] += 1
        counts["snapshots"] += 1
        counts["mixed_snapshots"] += len(set(states) - {"partial"}) > 1
    Path(out).write_text(json.dumps({**counts, "problems": problems[:20]}))
    return 0


def lookup(manager, kernel, expected: dict[str, bytes], problems: list[str]) -> str:
    """What Triton's compile() would find: get_group, then the files it opens."""
    try:
        group = manager.get_group(f"{kernel.name}.json")
    except (OSError, ValueError) as exc:
        problems.append(f"{kernel.key}: get_group raised {exc!r}")
        return "partial"
    if group is None:
        return "absent"
    wanted = {os.path.basename(f.path) for f in kernel.files if "__grp__" not in f.path}
    if set(group) != wanted:
        problems.append(f"{kernel.key}: group lists {sorted(group)}, the entry has {sorted(wanted)}")
        return "partial"
    for name, path in group.items():
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            problems.append(f"{kernel.key}/{name}: {exc!r}")
            return "partial"
        if data != expected[f"{kernel.key}/{name}"]:
            problems.append(f"{kernel.key}/{name}: bytes differ from the bundle")
            return "partial"
    return "complete"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the helpers package
    command, *args = sys.argv[1:]
    sys.exit({"install": install, "read": read, "rm": rm, "watch": watch}[command](*args))
