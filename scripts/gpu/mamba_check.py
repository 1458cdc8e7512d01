#!/usr/bin/env python3
"""The Mamba-2 proof on a GPU: vLLM's ``MambaMixer2`` on real tensors, with or without a bundle's Triton cache.

One fresh process per run (``run``): ``TRITON_CACHE_DIR`` is set before Triton is imported, kernelcache's compile
listener counts every ``compile()`` call (``cache_hit`` or a real compile, the autotuner's benchmark compiles
included) and every gcc build of a launcher, kernelcache's autotune log (exercise/autotune_log.py) counts every
candidate config Triton's autotuner times (``Autotuner._bench``) and every lookup of a kept choice
(``Autotuner.check_disk_cache``: a hit times nothing), and the layer, its state and its metadata are the ones
kernelcache's ``mamba`` exercise builds (exercise/vllm_mamba.py: ``MambaMixer2`` ->
``Mamba2AttentionMetadataBuilder`` -> ``MambaMixer2.forward``), natively: vLLM's CUDA platform, Triton's real
autotuner. The C op the pure-Python vLLM tree lacks (``_C::cutlass_scaled_mm_supports_fp8``, an import-time
capability query) is answered in Python (listed in the output). Steps: the engine's profile run (a dummy
``MAX_TOKENS`` step without attention metadata, in which vLLM warms the SSD kernels: where a server's autotuner
times them), then the requests: a fresh prefill over several chunks, its decode, decode batches, a mixed batch, a
chunked prefill continuing at an offset, a full ``MAX_TOKENS`` prefill. ``profile_s`` is the profile step (engine
start), ``first_call_s`` the first request's.
Weights and inputs are seeded, so two runs compute the same thing given the same autotune choices; the chosen
configs are recorded per run. ``reference`` checks the first prefill and its decode against a plain fp32 torch
Mamba-2 (conv, selective scan, gated group RMSNorm).

    python scripts/gpu/mamba_check.py run --cache-dir D --out R.json --outputs O.pt
    python scripts/gpu/mamba_check.py compare A.pt B.pt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

NEMOTRON_H_8B = {"hidden_size": 4096, "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128,
                 "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "dtype": "bfloat16",
                 "mamba_ssm_cache_dtype": "float32"}
MAX_SEQS, MAX_TOKENS = 8, 512
FIRST = 300  # tokens of the first prefill: three chunks of 128, the last partial
PROFILE = "profile"  # the engine's profile run (its output is the layer's unwritten buffer: not compared)


def steps() -> list[tuple[str, tuple]]:
    """(label, requests) with requests as (new tokens, tokens already in the state); request i owns block i + 1."""
    return [(PROFILE, ((MAX_TOKENS, 0),)), ("prefill", ((FIRST, 0),)), ("decode-1", ((1, FIRST),)),
            ("decode-8", ((1, FIRST + 1),) * 8),
            ("mixed", ((1, 40),) * 3 + ((100, 0),)), ("continued", ((1, 50), (77, 37))),
            ("prefill-max", ((MAX_TOKENS, 0),))]


def run(args) -> dict:
    os.environ["TRITON_CACHE_DIR"] = args.cache_dir
    import torch

    torch.zeros(1, device="cuda")
    from kernelcache.exercise import listener

    records: list[dict] = []
    gcc = Path(args.out).with_suffix(".gcc.jsonl")
    listener.install(also=records.append)
    listener.count_builds(str(gcc))
    from kernelcache.exercise import autotune_log

    tuned: list[dict] = []
    autotune_log.install(also=tuned.append)
    from kernelcache.exercise import vllm_mamba as vm

    substitutions = vm.prepare()
    dims = vm.Dims(*(NEMOTRON_H_8B[k] for k in ("hidden_size", "mamba_num_heads", "mamba_head_dim",
                                                   "ssm_state_size", "n_groups", "conv_kernel", "chunk_size",
                                                   "dtype", "mamba_ssm_cache_dtype")))
    with vm.tensor_parallel(1):
        layer = vm.make_layer(dims, MAX_SEQS, MAX_TOKENS)
        calls, outputs, inputs = [], {}, {}
        for label, requests in steps():
            calls.append(timed_step(layer, label, vm.Batch(requests), records, tuned, outputs, inputs))
    torch.save({"outputs": outputs, "inputs": inputs}, args.outputs)
    return {"cache_dir": args.cache_dir, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "describe": vm.describe(layer),
            "substitutions": substitutions, "calls": calls, "profile_s": calls[0]["seconds"],
            "first_call_s": calls[1]["seconds"], "total_s": round(sum(c["seconds"] for c in calls), 4),
            "compiles": sum(c["compiles"] for c in calls), "hits": sum(c["hits"] for c in calls),
            "gcc_builds": len(listener.read(str(gcc))), "benchmarks": sum(c["benchmarks"] for c in calls),
            "autotune_hits": sum(c["autotune_hits"] for c in calls),
            "autotune_misses": sum(c["autotune_misses"] for c in calls),
            "autotune_cache": os.environ.get("TRITON_CACHE_AUTOTUNING"),
            "autotune_guard": os.environ.get("KERNELCACHE_AUTOTUNE_CHECK"),
            "autotune": chosen(), "autotune_json": autotune_json(args), "reference": reference(layer, outputs, inputs)}


def timed_step(layer, label: str, batch, records: list[dict], tuned: list[dict], outputs: dict,
               inputs: dict) -> dict:
    import torch

    from kernelcache.exercise import vllm_mamba as vm

    hidden = vm.random_hidden(layer, batch)
    seen, looked = len(records), len(tuned)
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = (vm.profile if label == PROFILE else vm.forward)(layer, batch, hidden)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    if label != PROFILE:
        outputs[label], inputs[label] = out.float().cpu(), hidden.cpu()
    new, lookups = records[seen:], tuned[looked:]
    timed = [r for r in lookups if r["event"] == "autotune_bench"]
    kept = [r for r in lookups if r["event"] == "autotune"]
    return {"step": label, "tokens": batch.num_tokens, "seconds": round(seconds, 4),
            "compiles": sum(not r["cache_hit"] for r in new), "hits": sum(bool(r["cache_hit"]) for r in new),
            "benchmarks": len(timed), "autotune_hits": sum(r["hit"] for r in kept),
            "autotune_misses": sum(not r["hit"] for r in kept), "by_kernel": count_by_kernel(new)}


def count_by_kernel(records: list[dict]) -> dict:
    counts: dict = {}
    for r in records:
        row = counts.setdefault(r["name"], {"compiles": 0, "hits": 0})
        row["hits" if r["cache_hit"] else "compiles"] += 1
    return counts


def chosen() -> dict:
    """Per autotuned SSD kernel: the config Triton's autotuner chose per tuning key and its benchmark seconds."""
    import importlib

    from triton.runtime.autotuner import Autotuner

    from kernelcache.exercise.vllm_mamba import SSD_MODULES

    found = {}
    for name in SSD_MODULES:
        module = importlib.import_module(f"vllm.model_executor.layers.mamba.ops.{name}")
        for kernel in vars(module).values():
            if isinstance(kernel, Autotuner):
                found[kernel.base_fn.__name__] = {
                    "configs": len(kernel.configs), "bench_s": round(getattr(kernel, "bench_time", 0.0), 4),
                    "chosen": {str(key): str(config) for key, config in kernel.cache.items()}}
    return found


def autotune_json(args) -> list[str]:
    """The ``*.autotune.json`` files Triton wrote into the cache during this run (TRITON_CACHE_AUTOTUNING=1)."""
    return sorted(str(p.relative_to(args.cache_dir)) for p in Path(args.cache_dir).rglob("*.autotune.json"))


# -- the reference ----------------------------------------------------------------------------------------------


def reference(layer, outputs: dict, inputs: dict) -> dict:
    """The first prefill (fresh state) and the decode that continues it, against ``torch_mamba2`` on all
    ``FIRST + 1`` tokens."""
    import torch

    x = torch.cat([inputs["prefill"], inputs["decode-1"]]).cuda()
    want = torch_mamba2(layer.mixer, x)
    got = torch.cat([outputs["prefill"], outputs["decode-1"]]).cuda()
    return {"prefill": error(got[:FIRST], want[:FIRST]), "decode": error(got[FIRST:], want[FIRST:])}


def error(got, want) -> dict:
    diff = (got.float() - want.float()).abs()
    return {"max_abs": float(diff.max()), "max_rel": float(diff.max() / want.float().abs().max().clamp_min(1e-6))}


def torch_mamba2(mixer, x):
    """Mamba-2 on one sequence from a zero state, fp32: in_proj, causal depthwise conv + SiLU, the selective
    scan ``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t + D x_t``, gated group RMSNorm, out_proj."""
    import torch
    import torch.nn.functional as F

    heads, head_dim, state = mixer.num_heads, mixer.head_dim, mixer.ssm_state_size
    groups, inner = mixer.n_groups, mixer.intermediate_size
    proj = x.float() @ mixer.in_proj.weight.float().T
    gate, xbc, dt = torch.split(proj, [inner, mixer.conv_dim, heads], dim=-1)
    weight = mixer.conv_weights.float()  # [conv_dim, width]
    padded = F.pad(xbc.T, (weight.size(1) - 1, 0))
    conv = F.conv1d(padded[None], weight[:, None, :], mixer.conv1d.bias.float(), groups=weight.size(0))[0].T
    xs, b, c = torch.split(F.silu(conv), [inner, groups * state, groups * state], dim=-1)
    xs, b, c = xs.view(-1, heads, head_dim), b.view(-1, groups, state), c.view(-1, groups, state)
    per_group = heads // groups
    b, c = b.repeat_interleave(per_group, dim=1), c.repeat_interleave(per_group, dim=1)
    dt = F.softplus(dt + mixer.dt_bias.float())
    decay = torch.exp(dt * mixer.A.float())
    h = torch.zeros(heads, head_dim, state, device=x.device)
    ys = []
    for t in range(x.size(0)):
        h = decay[t][:, None, None] * h + (dt[t][:, None] * xs[t])[:, :, None] * b[t][:, None, :]
        ys.append((h * c[t][:, None, :]).sum(-1) + mixer.D.float()[:, None] * xs[t])
    y = torch.stack(ys).reshape(x.size(0), inner) * F.silu(gate)
    grouped = y.view(x.size(0), groups, inner // groups)
    y = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + mixer.norm.variance_epsilon)).view_as(y)
    return (y * mixer.norm.weight.float()) @ mixer.out_proj.weight.float().T


def compare(a: str, b: str) -> dict:
    import torch

    left, right = torch.load(a)["outputs"], torch.load(b)["outputs"]
    per_step = {k: {"identical": bool(torch.equal(left[k], right[k])),
                    "max_abs": float((left[k] - right[k]).abs().max())} for k in left if k in right}
    return {"identical": bool(per_step) and all(s["identical"] for s in per_step.values()), "per_step": per_step}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("--cache-dir", required=True)
    one.add_argument("--out", required=True)
    one.add_argument("--outputs", required=True)
    two = sub.add_parser("compare")
    two.add_argument("a")
    two.add_argument("b")
    args = parser.parse_args()
    if args.command == "run":
        result = run(args)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    else:
        result = compare(args.a, args.b)
    print(json.dumps({k: v for k, v in result.items() if k != "calls"}, indent=1, default=str)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
