#!/usr/bin/env python3
"""GPU fidelity sweep: does a CPU-built bundle hold every key vLLM's real sampler asks for on the GPU?

One fresh process per vocab size runs vLLM 0.33's own entry points on real CUDA tensors, written here
independently of kernelcache's exercise code:

* ``registry``: vLLM's ``JitWarmupRegistry`` over ``register_top_k_top_p_warmups()`` (engine start);
* ``mrv1``: ``vllm.v1.sample.sampler.Sampler`` with fp32 logits, each mode, seeded (a ``torch.Generator``
  per request: the ``forward_native`` Triton path) and unseeded;
* ``mrv2``: Model Runner V2's chain on an fp32 copy of model-dtype logits padded to 64 columns and
  sliced (``apply_temperature`` -> ``apply_min_p`` -> ``apply_top_k_top_p`` -> ``gumbel_sample``), each
  mode, min-p on and off, plus mixed rows (top-k rows beside top-p-only rows);
* ``gumbel``: MRV2's raw-logits Gumbel (greedy / unprocessed requests) in each model dtype;

over batch sizes 1..69 and a spread up to 256. Each vocab runs twice: against the bundle installed at
another path and mounted read-only (``bundle``), and against an empty cache (``cold``). Pass: 0 compiles
and 0 errors with the bundle, nothing written under it, and the same sampled tokens as the cold run.

    python scripts/gpu/fidelity_sweep.py --bundle B.tar.zst --vocab 1000 --vocab 50257 --out sweep.json

Needs a CUDA GPU of the bundle's arch, vLLM 0.33 importable (scripts/gpu/h200_fidelity.sh carries a
stripped tree) and root for the read-only bind mount (without it the cache is only relocated).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BATCHES = list(range(1, 70)) + [72, 80, 96, 112, 127, 128, 129, 160, 192, 224, 255, 256]
MODES = {"top_k": (True, False), "top_p": (False, True), "top_k_top_p": (True, True)}
DTYPES = ("float32", "bfloat16", "float16")
PAD = 64
KEY_IN_PATH = re.compile(r"/([A-Z2-7]{52})\b")


# -- child: one vocab, one cache ------------------------------------------------------------------


def child(vocab: int, max_batch: int) -> dict:
    import torch

    from kernelcache.hooks import kernelcache_listener

    events: list[dict] = []
    kernelcache_listener.install(also=events.append)
    gcc: list[dict] = []
    kernelcache_listener.count_builds(also=gcc.append)
    results: dict[str, str] = {}
    errors: list[dict] = []

    def call(name: str, fn) -> None:
        try:
            out = fn()
            torch.cuda.synchronize()
            if out is not None:
                results[name] = hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest()[:16]
        except Exception as exc:  # a miss on a read-only cache raises EROFS here; keep sweeping
            text = f"{type(exc).__name__}: {exc}"
            errors.append({"call": name, "error": text[:300], "key": _key_in(text)})

    call("registry", lambda: registry(vocab, max_batch))
    for batch in [b for b in BATCHES if b <= max_batch]:
        for mode in MODES:
            for seeded in (True, False):
                call(f"mrv1:{mode}:{'seeded' if seeded else 'unseeded'}:{batch}",
                     lambda b=batch, m=mode, s=seeded: mrv1(vocab, b, m, s))
            for min_p in (True, False):
                for dtype in ("bfloat16",) if min_p else DTYPES:
                    call(f"mrv2:{mode}:min_p={min_p}:{dtype}:{batch}",
                         lambda b=batch, m=mode, p=min_p, d=dtype: mrv2_chain(vocab, b, m, p, d, mixed=False))
        call(f"mrv2:mixed:{batch}", lambda b=batch: mrv2_chain(vocab, b, "top_k_top_p", True, "bfloat16", True))
        for dtype in DTYPES:
            call(f"gumbel:{dtype}:{batch}", lambda b=batch, d=dtype: raw_gumbel(vocab, b, d))
    compiles = [e for e in events if not e["cache_hit"]]
    return {"vocab": vocab, "calls": len(results) + len(errors), "hits": len(events) - len(compiles),
            "compiles": len(compiles), "compiled": sorted({(e["name"], e["key"]) for e in compiles}),
            "keys": sorted({(e["name"], e["key"]) for e in events}), "gcc_builds": len(gcc),
            "errors": errors, "outputs": results}


def _key_in(text: str) -> str | None:
    found = KEY_IN_PATH.search(text)
    return found.group(1) if found else None


def registry(vocab: int, max_num_seqs: int) -> None:
    from types import SimpleNamespace

    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry
    from vllm.v1.sample.ops.topk_topp_sampler import register_top_k_top_p_warmups

    config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: vocab),
                             scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs), num_speculative_tokens=0)
    reg = JitWarmupRegistry(config)
    with reg.activate():
        register_top_k_top_p_warmups()
    reg.warmup()


def _logits(batch: int, vocab: int, dtype: str, seed: int):
    """LM-head logits: [batch, vocab padded to 64] in the model dtype, sliced to the vocab."""
    import torch

    padded = -(-vocab // PAD) * PAD
    gen = torch.Generator(device="cuda").manual_seed(seed)
    full = torch.randn((batch, padded), generator=gen, device="cuda", dtype=torch.float32) * 3
    return full.to(getattr(torch, dtype))[:, :vocab]


def mrv1(vocab: int, batch: int, mode: str, seeded: bool):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    use_k, use_p = MODES[mode]

    def full(value, dtype=None):
        return torch.full((batch,), value, device="cuda", dtype=dtype)

    logits = _logits(batch, vocab, "float32", seed=batch).contiguous()
    generators = {i: torch.Generator(device="cuda").manual_seed(1000 + i) for i in range(batch)} if seeded else {}
    torch.manual_seed(batch)  # the unseeded draw too is repeatable across the two runs
    metadata = SamplingMetadata(
        temperature=full(0.7), all_greedy=False, all_random=True,
        top_p=full(0.9) if use_p else None, top_k=full(50, torch.int64) if use_k else None,
        generators=generators, max_num_logprobs=None, logprob_token_ids=None, no_penalties=True,
        prompt_token_ids=None, frequency_penalties=full(0.0), presence_penalties=full(0.0),
        repetition_penalties=full(1.0), output_token_ids=[[] for _ in range(batch)],
        spec_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())
    return Sampler()(logits=logits, sampling_metadata=metadata).sampled_token_ids


def mrv2_chain(vocab: int, batch: int, mode: str, min_p: bool, dtype: str, mixed: bool):
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample
    from vllm.v1.worker.gpu.sample.min_p import apply_min_p

    use_k, use_p = MODES[mode]
    state = _mrv2_state(batch, vocab, mixed)
    mapping = torch.arange(batch, dtype=torch.int64, device="cuda")  # input_batch.py: idx_mapping
    pos = torch.arange(batch, dtype=torch.int64, device="cuda")
    logits = _logits(batch, vocab, dtype, seed=batch)
    processed = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
    apply_temperature(processed, mapping, state["temperature"])
    if min_p:
        apply_min_p(processed, mapping, state["min_p"])
    top_k = state["top_k"][mapping] if use_k else None
    top_p = state["top_p"][mapping] if use_p else None
    processed = apply_top_k_top_p(processed, top_k, top_p, has_topp_only_rows=mixed or (use_p and not use_k))
    return gumbel_sample(processed, mapping, state["temperature"], state["seeds"], pos,
                         apply_temperature=False, is_drafting=False)


def raw_gumbel(vocab: int, batch: int, dtype: str):
    import torch
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    state = _mrv2_state(batch, vocab, False)
    mapping = torch.arange(batch, dtype=torch.int64, device="cuda")  # input_batch.py: idx_mapping
    pos = torch.arange(batch, dtype=torch.int64, device="cuda")
    return gumbel_sample(_logits(batch, vocab, dtype, seed=batch), mapping, state["temperature"], state["seeds"],
                         pos, apply_temperature=True, is_drafting=False)


def _mrv2_state(batch: int, vocab: int, mixed: bool) -> dict:
    """SamplingStates' per-request tensors and dtypes (v1/worker/gpu/sample/states.py)."""
    import torch

    top_k = torch.full((batch,), 50, dtype=torch.int32, device="cuda")
    if mixed:
        top_k[1::2] = vocab  # every other row has no active top-k: a top-p-only row
    return {"temperature": torch.full((batch,), 0.7, dtype=torch.float32, device="cuda"),
            "top_k": top_k, "top_p": torch.full((batch,), 0.9, dtype=torch.float32, device="cuda"),
            "min_p": torch.full((batch,), 0.05, dtype=torch.float32, device="cuda"),
            "seeds": torch.arange(batch, dtype=torch.int64, device="cuda") + 1234}


# -- parent: install, mount, run both caches, compare ----------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle")
    parser.add_argument("--vocab", type=int, action="append", help="[default: every vocab size the bundle's plan has]")
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--work", default="/tmp/kc-sweep")
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--out")
    parser.add_argument("--writable", action="store_true", help="No read-only mount: misses compile and are named "
                        "instead of failing; for listing what an older bundle lacks.")
    parser.add_argument("--no-cold", action="store_true", help="Skip the empty-cache runs (no output comparison).")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one vocab in a fresh process, started by run_child
        print(json.dumps(child(args.child, args.max_batch)))
        return 0
    if not (args.bundle and args.out):
        parser.error("--bundle and --out are required")
    args.vocab = args.vocab or planned_vocabs(Path(args.bundle))
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    base, how = install_read_only(Path(args.bundle), work, mount=not args.writable)
    before = tree(base)
    jobs = [(v, "bundle", base) for v in args.vocab]
    jobs += [] if args.no_cold else [(v, "cold", work / f"cold-{v}") for v in args.vocab]
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda job: run_child(job, args.max_batch, work), jobs))
    report = summarise(runs, how, written=diff(before, tree(base)))
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report["table"], indent=1))
    print("PASS" if report["pass"] else "FAIL")
    return 0 if report["pass"] else 1


def planned_vocabs(bundle: Path) -> list[int]:
    """The vocab sizes the bundle's build plan has."""
    from kernelcache.format.archive import read_manifest

    return [vocab["size"] for vocab in read_manifest(bundle).build.plan["vocabs"]]


def install_read_only(bundle: Path, work: Path, mount: bool = True) -> tuple[Path, str]:
    """Install under a HOME of its own at a path the build never saw, then bind-mount it onto itself
    read-only (an image layer or a read-only volume: installed where it is served, then frozen)."""
    cache = work / "served" / "cache"
    subprocess.run([sys.executable, "-m", "kernelcache", "install", str(bundle), "--cache-dir", str(cache)],
                   check=True, env={**os.environ, "HOME": str(work / "home-install")})
    if not mount:
        return cache, "relocated, writable"
    if _mount("--bind", cache, cache) and _mount("-o", "remount,ro,bind", cache):
        return cache, "relocated, read-only bind mount"
    return cache, "relocated, writable (no mount rights)"


def _mount(*args) -> bool:
    return subprocess.run(["mount", *map(str, args)], capture_output=True).returncode == 0


def run_child(job: tuple, max_batch: int, work: Path) -> dict:
    vocab, cache, cache_dir = job
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache_dir), "HOME": str(work / f"home-{cache}-{vocab}"),
           "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--max-batch", str(max_batch), "--child", str(vocab)],
                          capture_output=True, text=True, env=env, timeout=1500)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"vocab": vocab, "crashed": done.returncode, "stderr": done.stderr[-3000:]}
    return {**result, "cache": cache, "seconds": round(time.perf_counter() - start, 1)}


def tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def diff(before: dict, after: dict) -> list[str]:
    return sorted(set(after.items()) ^ set(before.items()))


def summarise(runs: list[dict], how: str, written: list) -> dict:
    table, missed = [], []
    by = {(r["vocab"], r["cache"]): r for r in runs}
    for vocab in sorted({r["vocab"] for r in runs}):
        bundle, cold = by[(vocab, "bundle")], by.get((vocab, "cold"), {"seconds": None})
        names = dict((k, n) for n, k in cold.get("keys", []))
        errors = bundle.get("errors", [])
        missed += [{"vocab": vocab, "call": e["call"], "key": e["key"], "kernel": names.get(e["key"])} for e in errors]
        missed += [{"vocab": vocab, "compiled": key, "kernel": name} for name, key in bundle.get("compiled", [])]
        same = [k for k in bundle.get("outputs", {}) if cold.get("outputs", {}).get(k) == bundle["outputs"][k]]
        table.append({"vocab": vocab, "mod16": vocab % 16, "calls": bundle.get("calls"), "hits": bundle.get("hits"),
                      "compiles": bundle.get("compiles"), "gcc_builds": bundle.get("gcc_builds"),
                      "errors": len(errors), "same_outputs": f"{len(same)}/{len(cold.get('outputs', {}))}",
                      "cold_compiles": cold.get("compiles"), "crashed": bundle.get("crashed") or cold.get("crashed"),
                      "seconds": [bundle["seconds"], cold["seconds"]]})
    ok = all(row["compiles"] == 0 and row["errors"] == 0 and row["gcc_builds"] == 0 and not row["crashed"]
             and row["same_outputs"].split("/")[0] == row["same_outputs"].split("/")[1] != "0" for row in table)
    return {"pass": ok and not written, "cache": how, "files_written": written, "table": table, "missed": missed,
            "runs": [{k: v for k, v in r.items() if k != "outputs"} for r in runs]}


if __name__ == "__main__":
    sys.exit(main())
