"""Summarise an h200_tune.sh run: the tune, then each Mamba-2 run's first call, compiles and benchmark runs.

    python scripts/gpu/summarise_tune.py OUT GPU_NAME > OUT/tune_proof.json

Reads what h200_tune.sh left in OUT (tune.json, mamba-<run>.json, install-<run>.json, compare-<run>.json,
ls-tuned.json); a file that is missing or not JSON shows as ``{"error": ...}`` in its place.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RUNS = ("cold", "cold2", "bundle", "bundle-warm", "bundle-served", "tuned", "tuned-served", "chosen")
PICK = ("profile_s", "first_call_s", "total_s", "compiles", "hits", "gcc_builds", "benchmarks", "autotune_hits",
        "autotune_misses", "autotune_cache", "autotune_guard", "error")
TARGET_S = 0.5  # issue 28: the tuned bundle's first use of the layer (profile run + first request), 0 benchmark runs


def read(folder: Path, name: str) -> dict:
    """The JSON file ``name`` in ``folder``, or what went wrong reading it."""
    try:
        return json.loads((folder / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{name}: {exc}"}


def tune_row(folder: Path) -> dict:
    tune = read(folder, "tune.json")
    row = {k: tune.get(k) for k in ("tuned_on", "benchmarks", "compiles", "hits", "seconds", "digest", "error")}
    row["choices"] = [(c["kernel"], c["key"], c["config"], c["candidates"]) for c in tune.get("choices", [])]
    return row


def run_row(folder: Path, name: str, run: dict) -> dict:
    row = {k: run.get(k) for k in PICK if k in run}
    row["first_use_s"] = first_use_s(run)
    if name not in ("cold", "cold2", "bundle-warm", "chosen"):
        row["install"] = {k: v for k, v in read(folder, f"install-{name}.json").items()
                          if k in ("action", "choices", "error")}
    if name != "cold":
        row["outputs_vs_cold"] = {k: v for k, v in read(folder, f"compare-{name}.json").items() if k != "per_step"}
    row["first_step_by_kernel"] = (run.get("calls") or [{}])[0].get("by_kernel")
    return row


def per_step(results: dict) -> list[dict]:
    steps = {n: {c["step"]: c for c in r.get("calls", [])} for n, r in results.items()}
    order = steps["cold"] or steps["tuned-served"]
    return [{"step": step, **{n: {k: steps[n][step].get(k) for k in ("seconds", "compiles", "benchmarks")}
                              for n in RUNS if step in steps[n]}} for step in order]


def summarise(folder: Path, gpu: str) -> dict:
    results = {name: read(folder, f"mamba-{name}.json") for name in RUNS}
    err = folder / "tune.err"
    summary = {"gpu": gpu, "env": (folder / "env.txt").read_text() if (folder / "env.txt").exists() else None,
               "tune": tune_row(folder), "tune_stderr": err.read_text()[-1500:] if err.exists() else None}
    summary.update({name: run_row(folder, name, results[name]) for name in RUNS})
    summary["per_step"] = per_step(results)
    summary["configs"] = {n: results[n].get("autotune") for n in ("cold", "cold2", "tuned-served")}
    summary["tuned_vs_chosen_outputs"] = {k: v for k, v in read(folder, "compare-tuned-vs-chosen.json").items()
                                          if k != "per_step"}
    summary["tuned_vs_served_outputs"] = {k: v for k, v in read(folder, "compare-tuned-vs-served.json").items()
                                          if k != "per_step"}
    summary["ls_tuned"] = [{k: b.get(k) for k in ("name", "tuned_on", "choices", "choices_skipped")}
                           for b in read(folder, "ls-tuned.json").get("bundles", [])]
    served = results["tuned-served"]
    first_use = first_use_s(served)
    summary["target_met"] = (first_use is not None and first_use <= TARGET_S and served.get("benchmarks") == 0
                             and served.get("compiles") == 0)
    return summary


def first_use_s(run: dict) -> float | None:
    """The layer's first use in a process: the profile run (where vLLM warms, and the autotuner times, the SSD
    kernels) plus the first request."""
    parts = (run.get("profile_s"), run.get("first_call_s"))
    return round(sum(parts), 4) if all(isinstance(p, float) for p in parts) else None


if __name__ == "__main__":
    print(json.dumps(summarise(Path(sys.argv[1]), sys.argv[2]), indent=1))
