#!/usr/bin/env python3
"""Where the first sampler call of a fresh process goes, with a bundle vs a plain warm Triton cache.

Each run is a fresh process. Everything up to the first call is done before the clock: ``import torch``,
CUDA init, the vLLM sampler imports and the inputs (scripts/bench_coldstart.py's scenarios, B=16). The
first call then runs under cProfile; the result is its wall time, the second call's, the time spent in
Triton's ``triton_key()`` (hashing libtriton) and in its driver's first initialisation, and the top
functions by cumulative time. Modes: ``bundle`` (installed with kernelcache at a fresh path, served with
only ``TRITON_CACHE_DIR`` set), ``seeded`` (the same, served with the variables ``kernelcache env`` gives:
its site dir, the install's kept ``triton_key()`` and tool outputs), ``keyonly`` (the same without the kept tool
outputs: Triton runs ``ptxas --version`` and ``ldconfig -p`` itself) and ``warm`` (the Triton cache a cold
process of the same scenario left, at its own path).

    python scripts/gpu/first_call_profile.py --bundle B.tar.zst --vocab 100352 --runs 3 --out profile.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def child(scenario: str, vocab: int) -> dict:
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    from bench_coldstart import _scenario

    step = _scenario(scenario, vocab)
    import triton.runtime.cache as cache

    spent = {"triton_key": 0.0}
    original = cache.triton_key

    def timed_key():
        mark = time.perf_counter()
        try:
            return original()
        finally:
            spent["triton_key"] += time.perf_counter() - mark

    cache.triton_key = timed_key
    import triton.compiler.compiler as compiler

    compiler.triton_key = timed_key
    torch.cuda.synchronize()
    spawned: list[list[str]] = []  # the commands the first call starts (the subprocess.Popen audit event)
    sys.addaudithook(lambda event, a: spawned.append([str(x) for x in a[1]]) if event == "subprocess.Popen" else None)
    profile = cProfile.Profile()
    mark = time.perf_counter()
    profile.enable()
    step()
    torch.cuda.synchronize()
    profile.disable()
    first = time.perf_counter() - mark
    mark = time.perf_counter()
    step()
    torch.cuda.synchronize()
    second = time.perf_counter() - mark
    return {"first_call": first, "second_call": second, "triton_key": spent["triton_key"], "spawned": spawned,
            "top": _top(profile)}


def _top(profile: cProfile.Profile, count: int = 40) -> list[dict]:
    """The ``count`` functions with the most cumulative time, then the 20 with the most time of their own."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = [{"function": f"{Path(file).name}:{line}:{name}", "calls": nc, "tottime": round(tt, 4),
             "cumtime": round(ct, 4)} for (file, line, name), (_, nc, tt, ct, _) in stats.stats.items()]
    return sorted(rows, key=lambda r: -r["cumtime"])[:count] + sorted(rows, key=lambda r: -r["tottime"])[:20]


def prepare(mode: str, scenario: str, vocab: int, bundle: str, root: Path) -> Path:
    cache = Path(tempfile.mkdtemp(prefix=f"{mode}-{scenario}-", dir=root))
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    if mode in ("bundle", "seeded", "keyonly"):
        subprocess.run([sys.executable, "-m", "kernelcache", "install", bundle, "--cache-dir", str(cache)],
                       check=True, env=env, capture_output=True)
        if mode == "keyonly":  # the kept triton_key() alone: Triton runs ptxas --version and ldconfig -p itself
            (cache / ".kernelcache" / "triton-keys" / "tool-outputs.json").unlink()
    else:  # a cold process fills the cache, as a plain warm Triton cache would be
        subprocess.run([sys.executable, __file__, "--child", scenario, "--vocab", str(vocab)], check=True, env=env,
                       capture_output=True)
    return cache


def run(mode: str, scenario: str, vocab: int, cache: Path) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    if mode in ("seeded", "keyonly"):
        found = subprocess.run([sys.executable, "-m", "kernelcache", "env", "--cache-dir", str(cache), "--json"],
                               check=True, env=env, capture_output=True, text=True)
        env.update(json.loads(found.stdout))
    done = subprocess.run([sys.executable, __file__, "--child", scenario, "--vocab", str(vocab)], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        return {"mode": mode, "scenario": scenario, "error": done.stderr[-2000:]}
    return {"mode": mode, "scenario": scenario, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--bundle")
    parser.add_argument("--vocab", type=int, default=100352)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="profile.json")
    parser.add_argument("--modes", default="bundle,seeded,warm",
                        help="comma-separated, of bundle, seeded, keyonly, warm")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.vocab)))
        return 0
    root = Path(tempfile.mkdtemp(prefix="kc-profile-"))
    pairs = [(m, s) for m in args.modes.split(",") for s in ("mrv1", "mrv2")]
    with ThreadPoolExecutor(len(pairs)) as pool:
        caches = dict(zip(pairs, pool.map(lambda p: prepare(*p, args.vocab, args.bundle, root), pairs)))
    rows = []
    for _ in range(args.runs):  # one process at a time: timings without neighbours
        rows += [run(m, s, args.vocab, caches[(m, s)]) for m, s in pairs]
        summary = [{"mode": m, "scenario": s, **summarise(rows, m, s)} for m, s in pairs]
        Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))  # each round: a
    print(json.dumps(summary, indent=1))  # device call cut short still leaves what it measured
    return 0


def summarise(rows: list[dict], mode: str, scenario: str) -> dict:
    mine = [r for r in rows if (r["mode"], r["scenario"]) == (mode, scenario) and "first_call" in r]
    return {k: statistics.median(r[k] for r in mine) if mine else None
            for k in ("first_call", "second_call", "triton_key")}


if __name__ == "__main__":
    sys.exit(main())
