#!/usr/bin/env python3
"""Throughput of verified bundle extraction (archive.extract): one synthetic bundle, best of N runs.

    .venv/bin/python scripts/bench_extract.py [--mib 64] [--runs 5]

The bundle holds 1 MiB members, half random bytes and half zeros (about 2:1 compression), written
at zstd level 3. Prints MiB of members extracted per second, with the machine and versions.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelcache.format import archive  # noqa: E402
from kernelcache.format.manifest import Build, Environment, FileRecord, Manifest, Module, Target  # noqa: E402


def synthetic(path: Path, mib: int) -> Manifest:
    rng, members = random.Random(0), {}
    for i in range(mib):
        key = "K" * 48 + "".join("ABCDEFGHIJ"[int(c)] for c in f"{i:04d}")
        members[f"{key}/m.so"] = rng.randbytes(1 << 19) + bytes(1 << 19)
    modules = tuple(Module("other", p.split("/")[0], (FileRecord(p, len(d), hashlib.sha256(d).hexdigest()),))
                    for p, d in members.items())
    manifest = Manifest(Target("cuda", "sm_90"), Environment("cp311", "x86_64-linux", None, None),
                        Build("bench", "pack"), modules=modules)
    archive.write(path, manifest, [(p, lambda d=d: d) for p, d in members.items()], level=3)
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kc-bench-"))
    bundle = work / "bench.tar.zst"
    manifest = synthetic(bundle, args.mib)
    best = float("inf")
    for _ in range(args.runs):
        shutil.rmtree(work / "x", ignore_errors=True)
        started = time.perf_counter()
        archive.extract(bundle, work / "x")
        best = min(best, time.perf_counter() - started)
    print(f"extract: {manifest.total_size / best / 2**20:.0f} MiB/s ({args.mib} MiB of members, "
          f"{bundle.stat().st_size / 2**20:.0f} MiB compressed, best of {args.runs}: {best:.3f} s); "
          f"FEED={archive.FEED}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, zstandard {importlib.metadata.version('zstandard')}")
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
