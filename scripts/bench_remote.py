"""How much the transport adds to an install: file vs oci:// (index resolved) vs http://, on loopback.

    .venv/bin/python scripts/bench_remote.py BUNDLE [--runs 5]

Starts its own registry and HTTP server (the ones the tests use), pushes BUNDLE, then times the
`kernelcache install` CLI into a fresh cache dir per run (median and range of wall-clock seconds,
process start included) and counts the registry requests one install makes. Prints JSON. Numbers
are for this machine and this bundle; loopback hides network latency, so the request count is the
figure that carries over to a real registry.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from servers import http_server, registry  # noqa: E402


def kc(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"kernelcache {' '.join(args)} failed: {done.stderr}")
    return done


def timed(args: list[str], work: Path, runs: int, again: bool = False) -> dict:
    """Fresh cache dir per run; ``again``: time a second install into a cache dir that already has it."""
    seconds = []
    for run in range(runs):
        cache = work / f"cache-{len(seconds)}-{run}-{time.monotonic_ns()}"
        if again:
            kc(*args, "--cache-dir", str(cache))
        started = time.perf_counter()
        kc(*args, "--cache-dir", str(cache))
        seconds.append(time.perf_counter() - started)
        shutil.rmtree(cache)
    return {"median_s": round(statistics.median(seconds), 3), "min_s": round(min(seconds), 3),
            "max_s": round(max(seconds), 3), "runs": runs}


def requests_logged(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if '"GET /v2/' in line or '"HEAD /v2/' in line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    bundle = options.bundle.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "registry").mkdir()
        (work / "www").mkdir()
        shutil.copy(bundle, work / "www" / bundle.name)
        with registry(work / "registry", access_log=True) as reg, http_server(work / "www") as site:
            ref = f"oci://{reg.host}/bench/kernels:v1"
            started = time.perf_counter()
            kc("push", str(bundle), ref)
            push_s = time.perf_counter() - started
            log = work / "registry" / "registry.log"
            before = requests_logged(log)
            kc("install", ref, "--arch", "sm_90", "--cache-dir", str(work / "count"))
            per_install = requests_logged(log) - before
            kc("install", ref, "--arch", "sm_90", "--cache-dir", str(work / "count"))
            per_reinstall = requests_logged(log) - before - per_install
            results = {
                "bundle_bytes": bundle.stat().st_size,
                "push_s": round(push_s, 3),
                "registry_reads_per_install": per_install,
                "registry_reads_per_reinstall": per_reinstall,
                "install_file": timed(["install", str(bundle)], work, options.runs),
                "install_oci_index": timed(["install", ref, "--arch", "sm_90"], work, options.runs),
                "reinstall_oci_index": timed(["install", ref, "--arch", "sm_90"], work, options.runs, again=True),
                "install_http": timed(["install", f"{site}/{bundle.name}"], work, options.runs),
            }
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
