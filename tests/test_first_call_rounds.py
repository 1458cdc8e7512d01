"""scripts/gpu/first_call_rounds.py and its two siblings on the CPU: the order each round runs its modes in
(first_call_rounds.py), what a process reports of its first call besides wall time (first_call_process.py), and the
summary's per-round comparison of the first served process after a fresh install with the second served process
(first_call_summary.py). (The rounds themselves run on a GPU; the lead runs them.)"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "first_call_rounds.py"


def load_rounds():
    spec = importlib.util.spec_from_file_location("first_call_rounds", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["first_call_rounds"] = module
    spec.loader.exec_module(module)
    return module


rounds = load_rounds()
process, summary_tables = sys.modules["first_call_process"], sys.modules["first_call_summary"]  # its siblings


def test_no_mode_always_runs_right_after_another():
    modes = ["warm", "served", "served-fresh"]
    orders = [rounds.round_order(modes, r) for r in (1, 2, 3)]
    assert orders[0] == modes and orders[2] == modes
    assert orders[1] == ["served-fresh", "served", "warm"]
    follows = {(order[i], order[i + 1]) for order in orders for i in range(len(order) - 1)}
    assert ("served", "served-fresh") in follows and ("served-fresh", "served") in follows


def test_usage_counts_this_threads_cpu_and_faults():
    usage = process.Usage()
    end = time.thread_time() + 0.05
    while time.thread_time() < end:  # CPU work of this thread
        pass
    pages = bytearray(8 << 20)
    pages[::4096] = b"\1" * len(pages[::4096])  # touches 2048 new pages
    used = usage.since()
    assert used["thread_cpu_ms"] >= 50 and used["cpu_ms"] >= used["thread_cpu_ms"] - 1
    assert used["minflt"] > 0
    assert set(used) == {"cpu_ms", "thread_cpu_ms", "minflt", "majflt", "vcsw", "ivcsw"}


def _row(ident, rnd, mode, wall, cpu, **more):
    return {"id": ident, "phase": "quiet", "round": rnd, "path": "k", "mode": mode, "first_call": wall,
            "second_call": 0.001, "compiles": 0, "builds": [], "first_call_phases": {},
            "first_call_usage": {"thread_cpu_ms": cpu, "minflt": 100}, **more}


def test_summary_compares_the_fresh_install_with_the_second_served_process_by_wall_and_cpu():
    rows = [_row(1, 0, "served", 0.05, 40.0, first_in_cache=True)]
    for rnd, (fresh, second, fresh_cpu, second_cpu) in enumerate([(0.06, 0.05, 40.0, 40.0),
                                                                  (0.05, 0.05, 30.0, 40.0)], start=1):
        rows += [_row(10 * rnd, rnd, "warm", 0.5, 400.0), _row(10 * rnd + 1, rnd, "served", second, second_cpu),
                 _row(10 * rnd + 2, rnd, "served-fresh", fresh, fresh_cpu)]
    summary = summary_tables.summarise(rows)
    fresh = next(r for r in summary["ratios"] if r["mode"] == "served-fresh")
    assert fresh["per_round"] == [0.12, 0.1]
    assert fresh["vs_second_served_per_round"] == [1.2, 1.0]
    assert fresh["cpu_vs_second_served_per_round"] == [1.0, 0.75]
    table = next(r for r in summary["table"] if r["mode"] == "served-fresh")
    assert table["thread_cpu_ms"] == [40.0, 30.0]
    assert "1.00×, 0.75×" in summary_tables.markdown(summary)


def _driver(tmp_path, *flags: str):
    import argparse

    rounds.tempfile.tempdir = str(tmp_path)  # the driver's work dir goes there

    args = argparse.Namespace(out=str(tmp_path / "out"), budget=60.0, pin=None, no_pin=False, fake=True)
    for flag in flags:
        if flag == "--no-pin":
            args.no_pin = True
        else:
            args.pin = int(flag)
    return rounds.Driver(args)


def test_every_timed_process_is_pinned_to_one_cpu_unless_told_not_to(tmp_path, monkeypatch):
    monkeypatch.setattr(rounds.tempfile, "tempdir", None)  # put back after the test
    spec = {"id": 1, "phase": "quiet", "round": 1, "path": "k", "mode": "warm"}
    command, _ = _driver(tmp_path).command(spec)
    assert command[command.index("--pin") + 1] == str(max(rounds.os.sched_getaffinity(0)))
    command, _ = _driver(tmp_path, "0").command(spec)
    assert command[command.index("--pin") + 1] == "0"
    command, _ = _driver(tmp_path, "--no-pin").command(spec)
    assert "--pin" not in command
