#!/usr/bin/env python3
"""The gated-delta-net proof on a GPU: vLLM's ``QwenGatedDeltaNetAttention`` (Qwen3-Next-80B-A3B's dims) on real
tensors, with or without a bundle's Triton cache.

One fresh process per run (``run``): ``TRITON_CACHE_DIR`` is set before Triton is imported, kernelcache's compile
listener counts every ``compile()`` call (``cache_hit`` or a real compile, the autotuner's candidate compiles
included) and every gcc build of a launcher, Triton's ``Autotuner._bench`` is wrapped to count the autotuner's
benchmark runs (one per candidate timed) and their seconds, and the layer, its state and its metadata are the ones
kernelcache's ``gdn`` exercise builds (exercise/vllm_gdn.py: ``QwenGatedDeltaNetAttention`` ->
``GDNAttentionMetadataBuilder`` -> ``forward``), natively: vLLM's CUDA platform, Triton's real autotuner, the FLA
Triton prefill (``--gdn-prefill-backend triton``). Steps: the engine's profile run (a dummy ``MAX_TOKENS`` step
without attention metadata, in which vLLM warms the FLA prefill kernels: where a server's autotuner times them;
``profile_s``), then the requests (``first_call_s`` is the first's): a fresh prefill over several chunks, its
decode, decode batches, a mixed batch, a chunked prefill continuing, a
``MAX_TOKENS`` prefill. Weights and inputs are seeded, so two runs compute the same thing given the same autotune
choices; the chosen configs are recorded per run. ``reference`` checks the first prefill and its decode against a
plain fp32 torch gated delta net (causal conv + SiLU, L2-normed q/k, the gated delta rule, gated RMSNorm).

``--cross CAP,SMS,PRODUCT`` is the CPU dry run: the same steps under kernelcache's fake target (FakeTensors, a
benchmark that only calls each candidate), counting compiles, hits and benchmark runs; no outputs, no reference.

    python scripts/gpu/gdn_check.py run --cache-dir D --out R.json --outputs O.pt [--cross 90,132,"NVIDIA H200"]
    python scripts/gpu/gdn_check.py compare A.pt B.pt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mamba_check import autotune_json, compare, count_by_kernel, error  # noqa: E402 -- the Mamba-2 check's helpers

QWEN3_NEXT = {"hidden_size": 2048, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
              "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
              "layout": "interleaved", "dtype": "bfloat16", "prefill_backend": "triton", "num_key_value_heads": 2,
              "head_dim": 256}
MAX_SEQS, MAX_TOKENS = 8, 512
FIRST = 300  # tokens of the first prefill: five chunks of 64, the last partial
PROFILE = "profile"  # the engine's profile run (its output is the layer's unwritten buffer: not compared)
BENCH: Counter = Counter()  # the autotuner's benchmark runs per kernel, this process
BENCH_SECONDS: Counter = Counter()


def steps() -> list[tuple[str, tuple]]:
    """(label, requests) with requests as (new tokens, tokens already in the state, -1); request i owns block
    i + 1."""
    return [(PROFILE, ((MAX_TOKENS, 0, -1),)), ("prefill", ((FIRST, 0, -1),)), ("decode-1", ((1, FIRST, -1),)),
            ("decode-8", ((1, FIRST + 1, -1),) * 8),
            ("mixed", ((1, 40, -1),) * 3 + ((100, 0, -1),)), ("continued", ((1, 50, -1), (77, 37, -1))),
            ("prefill-max", ((MAX_TOKENS, 0, -1),))]


def count_benchmarks() -> None:
    """Wrap ``Autotuner._bench``: every call is one candidate config timed on the device."""
    from triton.runtime.autotuner import Autotuner

    original = Autotuner._bench

    def bench(self, *args, config, **meta):
        started = time.perf_counter()
        try:
            return original(self, *args, config=config, **meta)
        finally:
            BENCH[self.base_fn.__name__] += 1
            BENCH_SECONDS[self.base_fn.__name__] += time.perf_counter() - started

    Autotuner._bench = bench


def fake_target(spec: str) -> str:
    """The CPU dry run: kernelcache's fake target for ``CAP,SMS,PRODUCT``; benchmarks only call each candidate."""
    capability, sms, product = spec.split(",", 2)
    os.environ["KERNELCACHE_TARGET_MODE"] = "cross"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import triton

    from kernelcache.exercise import fake_target as target
    from kernelcache.exercise.vllm_sampler import setup_platform

    target.activate(int(capability), int(sms), prebuild=False)
    setup_platform(int(capability), int(sms), product)

    def call_once(kernel_call, quantiles=None):
        kernel_call()
        return [1.0, 1.0, 1.0]

    triton.runtime.driver.active.get_benchmarker = lambda: call_once
    return product


def run(args) -> dict:
    os.environ["TRITON_CACHE_DIR"] = args.cache_dir
    device = fake_target(args.cross) if args.cross else None
    import torch

    if device is None:
        torch.zeros(1, device="cuda")
        device = torch.cuda.get_device_name()
    from kernelcache.exercise import listener

    records: list[dict] = []
    gcc = Path(args.out).with_suffix(".gcc.jsonl")
    listener.install(also=records.append)
    listener.count_builds(str(gcc))
    count_benchmarks()
    from kernelcache.exercise import vllm_gdn as vg
    from kernelcache.exercise.vllm_mamba import real_host, tensor_parallel
    from kernelcache.exercise.vllm_sampler import _device_scope

    substitutions = vg.prepare()
    dims = vg.Dims(**QWEN3_NEXT)
    with tensor_parallel(1), _device_scope(), real_host(), vg.device_zero():
        layer = vg.make_layer(dims, MAX_SEQS, MAX_TOKENS)
        calls, outputs, inputs = [], {}, {}
        for label, requests in steps():
            calls.append(timed_step(layer, label, vg.Batch(requests), records, outputs, inputs, bool(args.cross)))
        described = vg.describe(layer)
        checked = {} if args.cross else reference(layer, outputs, inputs)
    if not args.cross:
        torch.save({"outputs": outputs, "inputs": inputs}, args.outputs)
    return {"cache_dir": args.cache_dir, "device": device, "cross": bool(args.cross), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "describe": described, "substitutions": substitutions,
            "calls": calls, "profile_s": calls[0]["seconds"], "first_call_s": calls[1]["seconds"],
            "total_s": round(sum(c["seconds"] for c in calls), 4),
            "compiles": sum(c["compiles"] for c in calls), "hits": sum(c["hits"] for c in calls),
            "benchmark_runs": sum(BENCH.values()), "benchmark_s": round(sum(BENCH_SECONDS.values()), 4),
            "gcc_builds": len(listener.read(str(gcc))), "autotune": chosen(), "autotune_json": autotune_json(args),
            "autotuning_cache_env": os.environ.get("TRITON_CACHE_AUTOTUNING"), "reference": checked}


def timed_step(layer, label: str, batch, records: list[dict], outputs: dict, inputs: dict, cross: bool) -> dict:
    import torch

    from kernelcache.exercise import vllm_gdn as vg
    from kernelcache.exercise.vllm_mamba import random_hidden

    hidden = random_hidden(layer, batch)
    seen, benched = len(records), sum(BENCH.values())
    if not cross:
        torch.cuda.synchronize()
    started = time.perf_counter()
    out = (vg.profile if label == PROFILE else vg.forward)(layer, batch, hidden)
    if not cross:
        torch.cuda.synchronize()
    if not cross and label != PROFILE:
        outputs[label], inputs[label] = out.float().cpu(), hidden.cpu()
    seconds = time.perf_counter() - started
    new = records[seen:]
    return {"step": label, "tokens": batch.num_tokens, "seconds": round(seconds, 4),
            "compiles": sum(not r["cache_hit"] for r in new), "hits": sum(bool(r["cache_hit"]) for r in new),
            "benchmark_runs": sum(BENCH.values()) - benched, "by_kernel": count_by_kernel(new)}


def chosen() -> dict:
    """Per autotuned FLA kernel: its candidates, the config Triton's autotuner chose per tuning key, its benchmark
    runs and seconds in this process."""
    import importlib

    from kernelcache.exercise import vllm_gdn as vg

    found = {}
    for name in vg.FLA_MODULES:
        for kernel in vg.autotuners(importlib.import_module(f"{vg.FLA}.{name}")):
            fn = kernel.base_fn.__name__
            found[fn] = {"configs": len(kernel.configs), "benchmark_runs": BENCH[fn],
                         "benchmark_s": round(BENCH_SECONDS[fn], 4),
                         "chosen": {str(key): str(config) for key, config in kernel.cache.items()}}
    return found


# -- the reference ----------------------------------------------------------------------------------------------


def reference(layer, outputs: dict, inputs: dict) -> dict:
    """The first prefill (fresh state) and the decode that continues it, against ``torch_gdn`` on all
    ``FIRST + 1`` tokens; a failure of the reference itself is reported, not raised (the run's counts stand)."""
    import torch

    try:
        x = torch.cat([inputs["prefill"], inputs["decode-1"]]).cuda()
        want = torch_gdn(layer.attn, x)
        got = torch.cat([outputs["prefill"], outputs["decode-1"]]).cuda()
        return {"prefill": error(got[:FIRST], want[:FIRST]), "decode": error(got[FIRST:], want[FIRST:])}
    except Exception as exc:  # noqa: BLE001 -- the reference is a check beside the measurement
        return {"error": f"{type(exc).__name__}: {exc}"}


def torch_gdn(attn, x):
    """A gated delta net on one sequence from a zero state, fp32: the projections (unpacked as vLLM unpacks them),
    causal depthwise conv + SiLU, L2-normed q/k (q scaled by K^-1/2), ``g = -exp(A_log) softplus(a + dt_bias)``,
    ``beta = sigmoid(b)``, per value head ``S = exp(g) S; S += beta (v - S k) k^T; o = S q``, gated RMSNorm
    (``norm(o) * silu(z)``), out_proj."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        qkvz = x.float() @ attn.in_proj_qkvz.weight.float().T
        ba = x.float() @ attn.in_proj_ba.weight.float().T
        q, k, v, z, b, a = attn.fix_query_key_value_ordering(qkvz, ba)
        mixed = torch.cat([t.reshape(t.size(0), -1) for t in (q, k, v)], dim=-1)
        weight = attn.conv1d.weight.float().view(attn.conv1d.weight.size(0), -1)
        padded = F.pad(mixed.T, (weight.size(1) - 1, 0))
        conv = F.silu(F.conv1d(padded[None], weight[:, None, :], groups=weight.size(0))[0].T)
        heads_k, heads_v, dk, dv = attn.num_k_heads, attn.num_v_heads, attn.head_k_dim, attn.head_v_dim
        q, k, v = torch.split(conv, [heads_k * dk, heads_k * dk, heads_v * dv], dim=-1)
        q = F.normalize(q.view(-1, heads_k, dk), dim=-1) * dk**-0.5
        k = F.normalize(k.view(-1, heads_k, dk), dim=-1)
        v = v.reshape(-1, heads_v, dv)
        group = heads_v // heads_k
        q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
        g = -attn.A_log.float().exp() * F.softplus(a.float() + attn.dt_bias.float())
        o = delta_rule(q, k, v, g, torch.sigmoid(b.float()))
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + attn.norm.eps) * attn.norm.weight.float()
        o = o * F.silu(z.float())
        return o.reshape(x.size(0), -1) @ attn.out_proj.weight.float().T


def delta_rule(q, k, v, g, beta):
    """The gated delta rule from a zero state, per token and value head: ``S = exp(g) S; S += beta (v - S k) k^T;
    o = S q`` (``S`` is ``[V, K]``; q, k, v ``[T, heads, dim]``, g and beta ``[T, heads]``)."""
    import torch

    state = torch.zeros(v.size(1), v.size(2), k.size(2), device=v.device)
    out = []
    for t in range(v.size(0)):
        state = state * g[t].exp()[:, None, None]
        delta = (v[t] - (state @ k[t][:, :, None])[..., 0]) * beta[t][:, None]
        state = state + delta[:, :, None] * k[t][:, None, :]
        out.append((state @ q[t][:, :, None])[..., 0])
    return torch.stack(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("--cache-dir", required=True)
    one.add_argument("--out", required=True)
    one.add_argument("--outputs", required=True)
    one.add_argument("--cross", default="", help="CAP,SMS,PRODUCT: the CPU dry run under the fake target")
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
