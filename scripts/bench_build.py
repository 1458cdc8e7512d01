#!/usr/bin/env python3
"""Build-time benchmarks: `kernelcache build` wall time against --jobs and vocab sizes, and the build cache.

Scaling (issue 3): each configuration is one cross build for sm_90 / h200 of vLLM's registry, MRV1 and MRV2
paths (fp32), FlashInfer excluded (its build is one fixed ~80-120 s nvcc job per arch, see BENCHMARKS.md), in a
fresh process without a build cache. Prints a Markdown table and writes JSON.

    python scripts/bench_build.py [--configs 1x1,2x1,2x2,4x2] [--out build-bench.json]     (VOCABSxJOBS)

The build cache (issue 27), each scenario --repeat times (median reported), every build in a fresh process:

* rebuild:  the recipe (default: the default recipe for --arch sm_90 --gpu h200) into a fresh, empty build
            cache ("cold"), then again with that cache ("warm"); the two bundles must be byte-identical;
* vocab:    after those two, the recipe plus --extra-vocab with the same cache (one new vocab's kernels);
* profiles: the Qwen3-30B-A3B recipe for --gpu h100-sxm --gpu h200 into a fresh cache, against the two profiles
            built one by one with --no-build-cache.

    python scripts/bench_build.py --cache rebuild,vocab [--vocab 128256 --vocab 151936] [--repeat 3]
    python scripts/bench_build.py --cache profiles [--profile-flag=--path=moe ...]

``--vocab``/``--path``/``--dtype`` restrict the rebuild recipe to a subset (say which in BENCHMARKS.md);
``--profile-flag`` adds a flag to every profiles build (e.g. ``--profile-flag=--max-num-batched-tokens=512``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCABS = [128256, 151936, 32768, 262208, 129280, 201088, 131072, 152064]
QWEN3 = "qwen3-30b-a3b"  # a shipped recipe (kernelcache recipes)


def build(args: list[str], out: Path, cache: str | None) -> dict:
    """One `kernelcache build ... --json` in a fresh process: wall time and what each target reported."""
    flags = ["--no-build-cache"] if cache is None else ["--build-cache", cache]
    command = [sys.executable, "-m", "kernelcache", "build", *args, "--mode", "cross", "-o", str(out), "--json", *flags]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"build failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-3000:]}")
    targets = json.loads(done.stdout)
    return {"wall_s": wall, "load_avg_1m": os.getloadavg()[0], "compiles": sum(t["compiles"] for t in targets),
            "compile_s": sum(t["compile_seconds"] for t in targets),
            "reused": sum(t["build_cache"]["reused"] for t in targets),
            "units_reused": sum((t["build_cache"].get("units") or {}).get("reused", 0) for t in targets),
            "bundles_reused": sum(t["build_cache"].get("bundles", 0) for t in targets),
            "kernels": [b["kernels"] for t in targets for b in t["bundles"]],
            "bundles": sorted(b["path"] for t in targets for b in t["bundles"]),
            "cache_errors": cache_errors(targets)}


def cache_errors(targets: list[dict]) -> list[str]:
    """What the build cache reported failing (a store error, an exercise record that could not be restored): a warm
    build that ran a unit again says why here."""
    return [problem for t in targets for problem in (t.get("build_cache") or {}).get("errors", ())]


# -- scaling (issue 3) ---------------------------------------------------------------------------------


def scaling_run(vocabs: int, jobs: int, root: Path) -> dict:
    args = ["--arch", "sm_90", "--gpu", "h200", "--dtype", "float32", "--path", "registry", "--path", "mrv1",
            "--path", "mrv2", "--jobs", str(jobs)]
    for v in VOCABS[:vocabs]:
        args += ["--vocab", str(v)]
    out = Path(tempfile.mkdtemp(dir=root))
    found = build(args, out, None)
    size = sum(Path(p).stat().st_size for p in found["bundles"])
    return {"vocabs": vocabs, "jobs": jobs, "wall_s": found["wall_s"], "compiles": found["compiles"],
            "compile_s": found["compile_s"], "kernels": found["kernels"][0], "bundle_bytes": size}


def scaling(configs: str, root: Path) -> tuple[list[dict], list[str]]:
    rows = []
    for config in configs.split(","):
        vocabs, jobs = map(int, config.split("x"))
        rows.append(scaling_run(vocabs, jobs, root))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    table = ["| vocab sizes | --jobs | wall | compiles | summed compile time | kernels | bundle |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    table += [f"| {r['vocabs']} | {r['jobs']} | {r['wall_s']:.0f} s | {r['compiles']} | {r['compile_s']:.0f} s | "
              f"{r['kernels']} | {r['bundle_bytes'] / 2**20:.1f} MiB |" for r in rows]
    return rows, table


# -- the build cache (issue 27) ------------------------------------------------------------------------


def recipe_args(opts) -> list[str]:
    args = ["--arch", "sm_90", "--gpu", "h200", "--jobs", str(opts.jobs)]
    for flag, values in (("--vocab", opts.vocab), ("--path", opts.path), ("--dtype", opts.dtype)):
        for value in values or ():
            args += [flag, str(value)]
    return args


def rebuild_round(opts, root: Path, with_vocab: bool) -> dict:
    cache = root / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    args = recipe_args(opts)
    cold = build(args, root / "cold", str(cache))
    warm = build(args, root / "warm", str(cache))
    warm["same_bytes"] = [Path(p).read_bytes() for p in cold["bundles"]] == [
        Path(p).read_bytes() for p in warm["bundles"]]
    warm["same_triton_members"] = _triton_members(cold["bundles"]) == _triton_members(warm["bundles"])
    if not warm["same_triton_members"]:
        sys.exit("the warm build's Triton kernels or modules differ from the cold build's")
    found = {"cold": cold, "warm": warm}
    if with_vocab:
        vocabs = opts.vocab or _recipe_vocabs()
        extra = ["--vocab", str(opts.extra_vocab)] + [w for v in vocabs for w in ("--vocab", str(v))]
        found["vocab"] = build(_without_vocabs(args) + extra, root / "vocab", str(cache))
    return found


def _triton_members(bundles: list[str]) -> list[dict[str, bytes]]:
    """Each bundle's members but its manifest and FlashInfer's module: nvcc names its temporary files by pid
    (``tmpxft_<pid>_...``) and the module keeps those names, so two builds of it never have the same bytes."""
    from kernelcache.format.archive import iter_members

    return [{name: data for _, name, data in iter_members(b) if name != "manifest.json"
             and not name.startswith("flashinfer/")} for b in bundles]


def _recipe_vocabs() -> list[int]:
    from kernelcache.plan.recipe import load

    return [v.size for v in load(None).vocabs]


def _without_vocabs(args: list[str]) -> list[str]:
    out, skip = [], False
    for word in args:
        if skip:
            skip = False
        elif word == "--vocab":
            skip = True
        else:
            out.append(word)
    return out


def profiles_round(opts, root: Path) -> dict:
    cache = root / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    base = ["--recipe", QWEN3, "--arch", "sm_90", "--jobs", str(opts.jobs), *opts.profile_flag]
    together = build([*base, "--gpu", "h100-sxm", "--gpu", "h200"], root / "together", str(cache))
    apart = [build([*base, "--gpu", gpu], root / gpu, None) for gpu in ("h100-sxm", "h200")]
    separately = {"wall_s": sum(a["wall_s"] for a in apart), "compiles": sum(a["compiles"] for a in apart),
                  "compile_s": sum(a["compile_s"] for a in apart), "reused": 0, "units_reused": 0,
                  "kernels": [k for a in apart for k in a["kernels"]]}
    return {"together": together, "separately": separately}


def median(rounds: list[dict], scenario: str, field: str) -> float:
    return statistics.median(r[scenario][field] for r in rounds)


def cache_scenarios(opts, root: Path) -> tuple[list[dict], list[str]]:
    wanted = set(opts.cache.split(","))
    rounds = []
    for _ in range(opts.repeat):
        found = {}
        if wanted & {"rebuild", "vocab"}:
            found.update(rebuild_round(opts, root, "vocab" in wanted))
        if "profiles" in wanted:
            found.update(profiles_round(opts, root))
        rounds.append(found)
        print(json.dumps({k: {f: v.get(f) for f in ("wall_s", "compiles", "reused", "units_reused", "bundles_reused",
                                                    "cache_errors")}
                          for k, v in found.items()}),
              file=sys.stderr, flush=True)
    table = [f"| build | wall (median of {opts.repeat}) | compiles | reused from the build cache | vs. cold |",
             "| --- | --- | --- | --- | --- |"]
    labels = {"cold": "recipe, empty build cache", "warm": "recipe again, warm build cache",
              "vocab": f"recipe + vocab {opts.extra_vocab}, warm", "separately": "Qwen3-30B-A3B, h100-sxm then h200, "
              "no build cache", "together": "Qwen3-30B-A3B, --gpu h100-sxm --gpu h200, empty build cache"}
    for scenario, label in labels.items():
        if scenario not in rounds[0]:
            continue
        reference = {"warm": "cold", "vocab": "cold", "together": "separately"}.get(scenario)
        ratio = f"{median(rounds, scenario, 'wall_s') / median(rounds, reference, 'wall_s'):.0%}" if reference else "-"
        table.append(f"| {label} | {median(rounds, scenario, 'wall_s'):.0f} s | "
                     f"{median(rounds, scenario, 'compiles'):.0f} | {median(rounds, scenario, 'reused'):.0f} | "
                     f"{ratio} |")
    return rounds, table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="1x1,2x1,2x2,4x2", help="scaling: VOCABSxJOBS,...")
    ap.add_argument("--cache", default=None, help="build-cache scenarios: rebuild,vocab,profiles")
    ap.add_argument("--vocab", type=int, action="append", help="rebuild/vocab: restrict the recipe's vocab sizes")
    ap.add_argument("--path", action="append", help="rebuild/vocab: restrict the recipe's paths")
    ap.add_argument("--dtype", action="append", help="rebuild/vocab: restrict the recipe's dtypes")
    ap.add_argument("--extra-vocab", type=int, default=262144, help="vocab: the vocab added to the recipe's")
    ap.add_argument("--profile-flag", action="append", default=[], help="profiles: a flag for every build")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="build-bench.json")
    opts = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kc-build-bench-"))
    try:
        rows, table = cache_scenarios(opts, root) if opts.cache else scaling(opts.configs, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
               "versions": _versions()}
    Path(opts.out).write_text(json.dumps({"machine": machine, "options": vars(opts), "rows": rows}, indent=1))
    print("\n".join(table))
    return 0


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("triton", "torch", "vllm", "flashinfer-python", "kernelcache"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


if __name__ == "__main__":
    sys.exit(main())
