"""Processes the concurrency tests start: ``python tests/helpers/procs.py COMMAND ARGS...``.

``install BUNDLE CACHE GO``: warm up (imports, the Triton fingerprint), say so with a file
``GO.ready.<pid>``, wait until the file GO exists so that every process starts installing at once,
run ``kernelcache install`` (the CLI's own ``main``), then read the cache back as a Triton reader
would and print one JSON line.

``read BUNDLE POINTER STOP OUT``: a Triton process that, until STOP exists, keeps looking up every
kernel of BUNDLE with Triton's own ``FileCacheManager`` in the cache dir named by the file POINTER
(which the test moves from one install to the next) and counts what it finds: absent, complete,
or partial (a group file whose children are missing or differ from the bundle). Writes OUT.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def install(bundle: str, cache: str, go: str) -> int:
    from helpers.cachecheck import bundle_state, expected_bytes

    from kernelcache.bundle import archive
    from kernelcache.bundle.fingerprint import local_environment
    from kernelcache.cli import main

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


def read(bundle: str, pointer: str, stop: str, out: str) -> int:
    import triton
    from triton.runtime.cache import FileCacheManager

    from kernelcache.bundle import archive

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
    sys.exit({"install": install, "read": read}[command](*args))
