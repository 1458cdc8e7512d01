#!/usr/bin/env python3
"""The tables of scripts/gpu/first_call_rounds.py, from its rows: per phase, path and mode every first call (in round
order), median, min, max, the call's CPU and faults, time by phase; each served mode against the plain warm cache of
the same round, and the first served process after a fresh install against the second served process.

    python3 scripts/gpu/first_call_summary.py ROWS      # rewrite summary.json/.md beside ROWS (rows.jsonl), print .md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def write_summary(rows: list[dict], out: Path) -> None:
    summary = summarise(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))


def summarise(rows: list[dict]) -> dict:
    """Per phase, path and mode: every first call (in round order), median, min, max; served vs warm per round."""
    timed = [r for r in rows if "first_call" in r and not r.get("profile") and r["mode"] != "cold"]
    groups: dict = {}
    for row in timed:
        label = "served (first in cache)" if row.get("first_in_cache") else row["mode"]
        groups.setdefault((row["phase"], row["path"], label), []).append(row)
    table = []
    for (phase, path, mode), group in sorted(groups.items()):
        values = [r["first_call"] for r in sorted(group, key=lambda r: r["round"])]
        table.append({"phase": phase, "path": path, "mode": mode, "n": len(values),
                      "first_calls_ms": [round(v * 1000, 1) for v in values],
                      "median_ms": round(statistics.median(values) * 1000, 1),
                      "min_ms": round(min(values) * 1000, 1), "max_ms": round(max(values) * 1000, 1),
                      "second_call_ms": round(statistics.median(r["second_call"] for r in group) * 1000, 2),
                      "compiles": sorted({r["compiles"] for r in group}),
                      "builds": sorted({b for r in group for b in r["builds"]}),
                      "triton_key_ms": [round(_seconds(r, "triton_key") * 1000, 1) for r in group],
                      "thread_cpu_ms": [_used(r, "thread_cpu_ms") for r in sorted(group, key=lambda r: r["round"])],
                      "minflt": [_used(r, "minflt") for r in sorted(group, key=lambda r: r["round"])],
                      "walks": sorted({json.dumps(r["walks"]) for r in group if r.get("walks")}),
                      "phases_ms": _median_phases(group)})
    return {"table": table, "ratios": ratios(timed), "failed": [
        {k: r.get(k) for k in ("id", "phase", "round", "path", "mode", "error", "stderr_tail")}
        for r in rows if "error" in r]}


def _used(row: dict, name: str):
    """One of the first call's ``Usage`` numbers (None in rows from before the harness kept them)."""
    return (row.get("first_call_usage") or {}).get(name)


def _seconds(row: dict, phase: str) -> float:
    return row.get("first_call_phases", {}).get(phase, {}).get("seconds", 0.0)


def _median_phases(group: list[dict]) -> dict:
    names = {name for r in group for name in r.get("first_call_phases", {}) if isinstance(r, dict)}
    found = {}
    for name in sorted(names):
        values = [_seconds(r, name) for r in group]
        found[name] = round(statistics.median(values) * 1000, 2)
    found["gc"] = round(statistics.median(r.get("gc_seconds", 0.0) for r in group) * 1000, 2)
    return found


def ratios(rows: list[dict]) -> list[dict]:
    """Each served mode's first call over the plain warm cache's of the same phase, path and round."""
    warm = {(r["phase"], r["path"], r["round"]): r["first_call"] for r in rows if r["mode"] == "warm"}
    found = {}
    for row in rows:
        base = warm.get((row["phase"], row["path"], row["round"]))
        if row["mode"].startswith("served") and base and not row.get("first_in_cache"):
            found.setdefault((row["phase"], row["path"], row["mode"]), []).append(round(row["first_call"] / base, 3))
    second = {(r["phase"], r["path"], r["round"]): r for r in rows
              if r["mode"] == "served" and not r.get("first_in_cache")}
    fresh, cpu = {}, {}
    for row in rows:
        other = second.get((row["phase"], row["path"], row["round"]))
        if row["mode"] != "served-fresh" or not other:
            continue
        fresh.setdefault((row["phase"], row["path"]), []).append(round(row["first_call"] / other["first_call"], 3))
        if _used(row, "thread_cpu_ms") and _used(other, "thread_cpu_ms"):
            cpu.setdefault((row["phase"], row["path"]), []).append(
                round(_used(row, "thread_cpu_ms") / _used(other, "thread_cpu_ms"), 3))
    return [{"phase": p, "path": path, "mode": m, "per_round": v, "max": max(v), "median": statistics.median(v),
             "every_round_at_most_0.25": max(v) <= 0.25, "every_round_at_most_0.2": max(v) <= 0.2,
             "vs_second_served_per_round": fresh.get((p, path)) if m == "served-fresh" else None,
             "cpu_vs_second_served_per_round": cpu.get((p, path)) if m == "served-fresh" else None}
            for (p, path, m), v in sorted(found.items())]


def markdown(summary: dict) -> str:
    lines = ["| phase | path | mode | first calls, ms (round order) | median [min-max] | vs warm, per round | "
             "vs served, per round | the call's CPU (its thread), ms | CPU vs served | second call | compiles | "
             "triton_key() in the call, ms | walks |",
             "|" + " --- |" * 13]
    by = {(r["phase"], r["path"], r["mode"]): r for r in summary["ratios"]}
    for row in summary["table"]:
        ratio = by.get((row["phase"], row["path"], row["mode"]))
        calls = ", ".join(map(str, row["first_calls_ms"]))
        lines.append(f"| {row['phase']} | {row['path']} | {row['mode']} | {calls} | "
                     f"{row['median_ms']} [{row['min_ms']}-{row['max_ms']}] | "
                     f"{', '.join(f'{v:.2f}×' for v in ratio['per_round']) if ratio else ''} | "
                     f"{', '.join(f'{v:.2f}×' for v in (ratio or {}).get('vs_second_served_per_round') or ())} | "
                     f"{', '.join(str(v) for v in row['thread_cpu_ms'] if v is not None)} | "
                     f"{', '.join(f'{v:.2f}×' for v in (ratio or {}).get('cpu_vs_second_served_per_round') or ())} | "
                     f"{row['second_call_ms']} ms | {row['compiles']} | {', '.join(map(str, row['triton_key_ms']))} | "
                     f"{'; '.join(row['walks'])} |")
    lines += ["", "Median time inside the first call, ms, by phase (inclusive; nested: compile > get_cache_key > "
              "triton_key, cache_key; init_handles > launcher_init, module_load):", ""]
    names = sorted({n for row in summary["table"] for n in row["phases_ms"]})
    lines.append("| phase | path | mode | " + " | ".join(names) + " |")
    lines.append("| --- | --- | --- | " + " | ".join("---" for _ in names) + " |")
    for row in summary["table"]:
        lines.append(f"| {row['phase']} | {row['path']} | {row['mode']} | "
                     + " | ".join(str(row["phases_ms"].get(n, "")) for n in names) + " |")
    if summary["failed"]:
        lines += ["", f"{len(summary['failed'])} process(es) failed: see summary.json"]
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit("usage: first_call_summary.py ROWS (a rows.jsonl of first_call_rounds.py)")
    rows_file = Path(sys.argv[1])
    write_summary([json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()], rows_file.parent)
    print((rows_file.parent / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
