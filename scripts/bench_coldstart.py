#!/usr/bin/env python3
"""Cold-start benchmark: first-step latency of vLLM's seeded sampler paths, with and without a bundle.

Each measurement is a fresh Python process (as a new pod is). Per process, in order: import torch,
CUDA init, import triton, Triton driver init, ``triton_key()``, the vLLM sampler imports, the first
sampling step (synchronised), the second step; plus compiles/hits (``triton.knobs.compilation.listener``),
gcc builds of Triton's launchers, and a digest of the sampled tokens (same seeds -> same tokens).

Scenarios: ``mrv1`` -- ``vllm.v1.sample.sampler.Sampler`` with a seeded ``torch.Generator`` (the
``forward_native`` Triton path); ``mrv2`` -- MRV2's seeded chain (temperature, top-k/top-p, Gumbel with
per-request seeds). Cache modes: ``none`` (a fresh empty TRITON_CACHE_DIR), ``bundle`` (the bundle
installed at a fresh path), ``bundle+prewarm`` (the same, with ``triton_key()`` computed in a background
thread from process start: measured on the H200 to move 0.35 s off the critical path but to slow the
imports by as much, so kernelcache's loader does not do it; see BENCHMARKS.md).

    python scripts/bench_coldstart.py --bundle B.tar.zst --vocab 128256 --runs 5 --out results.json

Needs a CUDA GPU of the bundle's arch and vLLM importable (see scripts/gpu/h200_run.sh for the H200).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH = 16


def child(scenario: str, vocab: int, prewarm: bool) -> dict:
    t = {}
    start = time.perf_counter()
    if prewarm:  # the experiment of issue 4.4: hash libtriton in a thread while torch/vLLM import
        import threading

        def key() -> None:
            from triton.runtime.cache import triton_key

            triton_key()

        threading.Thread(target=key, daemon=True).start()
    mark = time.perf_counter()
    import torch

    t["import_torch"] = time.perf_counter() - mark
    mark = time.perf_counter()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t["cuda_init"] = time.perf_counter() - mark
    mark = time.perf_counter()
    import triton

    from kernelcache.hooks import kernelcache_listener

    events: list[dict] = []
    kernelcache_listener.install(also=events.append)
    gcc: list[float] = []
    kernelcache_listener.count_builds(also=lambda record: gcc.append(record["seconds"]))
    t["import_triton"] = time.perf_counter() - mark
    mark = time.perf_counter()
    triton.runtime.driver.active.get_current_target()
    t["driver_init"] = time.perf_counter() - mark
    mark = time.perf_counter()
    from triton.runtime.cache import triton_key

    triton_key()
    t["triton_key"] = time.perf_counter() - mark
    mark = time.perf_counter()
    step = _scenario(scenario, vocab)
    t["import_vllm"] = time.perf_counter() - mark
    gcc_before = len(gcc)
    torch.cuda.synchronize()
    mark = time.perf_counter()
    tokens = step()
    torch.cuda.synchronize()
    t["first_step"] = time.perf_counter() - mark
    first_events, first_gcc = list(events), gcc[gcc_before:]
    mark = time.perf_counter()
    step()
    torch.cuda.synchronize()
    t["second_step"] = time.perf_counter() - mark
    t["process_to_first_token"] = time.perf_counter() - start
    return {"timings": t, "compiles": sum(not e["cache_hit"] for e in first_events),
            "hits": sum(e["cache_hit"] for e in first_events), "gcc_builds": len(first_gcc),
            "gcc_seconds": sum(first_gcc), "tokens_sha256": hashlib.sha256(tokens.cpu().numpy().tobytes()).hexdigest()}


def _scenario(name: str, vocab: int):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(1234)
    logits = torch.randn((BATCH, vocab), generator=gen, device="cuda") * 3
    if name == "mrv1":
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.sampler import Sampler

        sampler = Sampler()

        def full(v):
            return torch.full((BATCH,), v, device="cuda")

        def step():
            generators = {i: torch.Generator(device="cuda").manual_seed(i) for i in range(BATCH)}
            md = SamplingMetadata(
                temperature=full(0.5), all_greedy=False, all_random=True, top_p=full(0.9), top_k=full(vocab - 1),
                generators=generators, max_num_logprobs=None, logprob_token_ids=None, no_penalties=True,
                prompt_token_ids=None, frequency_penalties=full(0.0), presence_penalties=full(0.0),
                repetition_penalties=full(1.0), output_token_ids=[[] for _ in range(BATCH)],
                spec_token_ids=[[] for _ in range(BATCH)], allowed_token_ids_mask=None, bad_words_token_ids={},
                logitsprocs=LogitsProcessors())
            return sampler(logits=logits.clone(), sampling_metadata=md).sampled_token_ids
        return step
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample

    idx = torch.arange(BATCH, dtype=torch.int64, device="cuda")
    temp = torch.full((BATCH,), 0.7, dtype=torch.float32, device="cuda")
    seeds = torch.arange(BATCH, dtype=torch.int64, device="cuda") + 1234
    pos = torch.full((BATCH,), 10, dtype=torch.int64, device="cuda")
    k = torch.full((BATCH,), 50, dtype=torch.int32, device="cuda")
    p = torch.full((BATCH,), 0.9, dtype=torch.float32, device="cuda")

    def step():
        x = logits.clone()
        apply_temperature(x, idx, temp)
        x = apply_top_k_top_p(x, k, p, has_topp_only_rows=False)
        return gumbel_sample(x, idx, temp, seeds, pos, apply_temperature=False, is_drafting=False)
    return step


def run_one(scenario: str, mode: str, vocab: int, bundle: str | None, root: Path) -> dict:
    cache = Path(tempfile.mkdtemp(prefix=f"{mode.replace('+', '-')}-", dir=root))
    home = Path(tempfile.mkdtemp(prefix="home-", dir=root))
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "HOME": str(home), "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    install_seconds = None
    if mode.startswith("bundle"):
        mark = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kernelcache", "install", bundle, "--cache-dir", str(cache)],
                       check=True, env=env, capture_output=True)
        install_seconds = time.perf_counter() - mark
    args = [sys.executable, __file__, "--child", scenario, "--vocab", str(vocab)]
    if mode.endswith("prewarm"):
        args.append("--prewarm")
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"scenario": scenario, "mode": mode, "error": done.stderr[-2000:]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"scenario": scenario, "mode": mode, "install_seconds": install_seconds, **result}


def summarise(rows: list[dict]) -> list[dict]:
    table = []
    for key in sorted({(r["scenario"], r["mode"]) for r in rows if "timings" in r}):
        group = [r for r in rows if (r["scenario"], r["mode"]) == key and "timings" in r]
        entry = {"scenario": key[0], "mode": key[1], "n": len(group),
                 "compiles": sorted({r["compiles"] for r in group}),
                 "gcc_builds": sorted({r["gcc_builds"] for r in group}),
                 "tokens": sorted({r["tokens_sha256"][:12] for r in group})}
        for name in group[0]["timings"]:
            values = [r["timings"][name] for r in group]
            entry[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        table.append(entry)
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", choices=["mrv1", "mrv2"])
    ap.add_argument("--prewarm", action="store_true")
    ap.add_argument("--bundle")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scenarios", default="mrv1,mrv2")
    ap.add_argument("--modes", default="none,bundle,bundle+prewarm")
    ap.add_argument("--parallel", type=int, default=1, help="processes at once (1 = the cleanest timings)")
    ap.add_argument("--out", default="coldstart.json")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.vocab, args.prewarm)))
        return 0
    from concurrent.futures import ThreadPoolExecutor

    root = Path(tempfile.mkdtemp(prefix="kc-bench-"))
    plan = [(run, s, m) for run in range(args.runs) for s in args.scenarios.split(",") for m in args.modes.split(",")]

    def one(item):  # interleaved runs, so drift hits every mode alike
        run, scenario, mode = item
        row = {"run": run, **run_one(scenario, mode, args.vocab, args.bundle, root)}
        print(json.dumps(row), file=sys.stderr, flush=True)
        return row

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        rows = list(pool.map(one, plan))
    summary = summarise(rows)
    Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    for entry in summary:  # one line per scenario and mode: the medians
        print(entry["scenario"], entry["mode"], entry["n"], entry["compiles"], entry["gcc_builds"], entry["tokens"],
              {k: round(v["median"], 3) for k, v in entry.items() if isinstance(v, dict)})
    return 0 if all("timings" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
