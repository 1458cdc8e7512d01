#!/usr/bin/env python3
"""Build-time benchmark: `kernelcache build` wall time against --jobs and the number of vocab sizes.

Each configuration is one cross build for sm_90 / h200 of vLLM's registry, MRV1 and MRV2 paths (fp32),
FlashInfer excluded (its build is one fixed ~80-120 s nvcc job per arch, see BENCHMARKS.md), in a fresh
process with a fresh cache. Prints a Markdown table and writes JSON.

    python scripts/bench_build.py [--configs 1x1,2x1,2x2,4x2] [--out build-bench.json]
    (VOCABSxJOBS)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCABS = [128256, 151936, 32768, 262208, 129280, 201088, 131072, 152064]


def run(vocabs: int, jobs: int, root: Path) -> dict:
    out = Path(tempfile.mkdtemp(dir=root))
    args = [sys.executable, "-m", "kernelcache", "build", "--arch", "sm_90", "--gpu", "h200", "--dtype", "float32",
            "--path", "registry", "--path", "mrv1", "--path", "mrv2", "--mode", "cross", "--jobs", str(jobs),
            "-o", str(out), "--json"]
    for v in VOCABS[:vocabs]:
        args += ["--vocab", str(v)]
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    target = json.loads(done.stdout)[0]
    bundle = target["bundles"][0]
    return {"vocabs": vocabs, "jobs": jobs, "wall_s": wall, "compiles": target["compiles"],
            "compile_s": target["compile_seconds"], "kernels": bundle["kernels"], "bundle_bytes": bundle["size"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="1x1,2x1,2x2,4x2")
    ap.add_argument("--out", default="build-bench.json")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kc-build-bench-"))
    rows = []
    for config in args.configs.split(","):
        vocabs, jobs = map(int, config.split("x"))
        rows.append(run(vocabs, jobs, root))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    Path(args.out).write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    print("| vocab sizes | --jobs | wall | compiles | summed compile time | kernels | bundle |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['vocabs']} | {r['jobs']} | {r['wall_s']:.0f} s | {r['compiles']} | {r['compile_s']:.0f} s | "
              f"{r['kernels']} | {r['bundle_bytes'] / 2**20:.1f} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
