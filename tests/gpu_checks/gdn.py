"""The gated-delta-net check on a GPU (scripts/gpu/prove.py gdn): vLLM's ``QwenGatedDeltaNetAttention`` on real
tensors.

Triton's ``Autotuner._bench`` is wrapped to count the autotuner's benchmark runs (one per candidate timed) and
their seconds. The layer, its state and its metadata are the ones kernelcache's ``gdn`` exercise builds
(exercise/vllm_gdn.py: ``QwenGatedDeltaNetAttention`` -> ``GDNAttentionMetadataBuilder`` -> ``forward``) with the
bundle's task (dims, dtype, drafts, prefill backend, the attention layers' page), natively: vLLM's CUDA platform,
Triton's real autotuner. Steps (gpu_checks/common.py): the engine's profile run (a dummy step of
``max_num_batched_tokens`` tokens without attention metadata, in which vLLM warms the FLA prefill kernels: where a
server's autotuner times them; ``profile_s``), then the requests (``first_call_s`` is the first's). Weights and
inputs are seeded, so two processes compute the same thing given the same autotune choices; the chosen configs
are recorded. ``reference`` checks the first prefill and its decode against a plain fp32 torch gated delta net
(causal conv + SiLU, L2-normed q/k, the gated delta rule, gated RMSNorm).
"""

from __future__ import annotations

import os
import time
from collections import Counter

from common import autotune_json, count_by_kernel, error, steps, timed

BENCH: Counter = Counter()  # the autotuner's benchmark runs per kernel, this process
BENCH_SECONDS: Counter = Counter()


def check(tasks: list[dict], records: list[dict]) -> dict:
    from kernelcache.exercise import vllm_gdn as vg
    from kernelcache.exercise.layers import real_host, tensor_parallel

    count_benchmarks()
    task = tasks[0]["kwargs"]
    substitutions = vg.prepare()
    dims = vg.Dims(task["hidden_size"], task["linear_num_key_heads"], task["linear_num_value_heads"],
                   task["linear_key_head_dim"], task["linear_value_head_dim"], task["linear_conv_kernel_dim"],
                   task["layout"], task["dtype"], task["mamba_ssm_cache_dtype"], task["num_speculative_tokens"],
                   task["tensor_parallel_size"], task["gdn_prefill_backend"], task["num_key_value_heads"],
                   task["head_dim"], task["attention_backend"], task["kv_cache_dtype"], task["block_size"],
                   task["max_model_len"])
    seqs, tokens = task["max_num_seqs"], task["max_num_batched_tokens"]
    with tensor_parallel(dims.tp, vg.TP_USERS), real_host(), vg.device_zero():  # real CUDA tensors: no fake device
        layer = vg.make_layer(dims, seqs, tokens)
        calls, outputs, inputs = [], {}, {}
        for label, requests in steps(seqs, tokens, (-1,)):
            calls.append(timed_step(layer, label, vg.Batch(requests), records, outputs, inputs))
        described = vg.describe(layer)
        checked = reference(layer, outputs, inputs)
    return {"describe": described, "substitutions": substitutions, "calls": calls, "profile_s": calls[0]["seconds"],
            "first_call_s": calls[1]["seconds"], "total_s": round(sum(c["seconds"] for c in calls), 4),
            "benchmark_runs": sum(BENCH.values()), "benchmark_s": round(sum(BENCH_SECONDS.values()), 4),
            "autotune": chosen(), "autotune_json": autotune_json(),
            "autotuning_cache_env": os.environ.get("TRITON_CACHE_AUTOTUNING"), "reference": checked,
            "outputs": outputs}


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


def timed_step(layer, label: str, batch, records: list[dict], outputs: dict, inputs: dict) -> dict:
    from kernelcache.exercise import vllm_gdn as vg

    seen, benched = len(records), sum(BENCH.values())
    seconds = timed(vg, layer, label, batch, outputs, inputs)
    new = records[seen:]
    return {"step": label, "tokens": batch.num_tokens, "seconds": round(seconds, 4),
            "compiles": sum(not r["cache_hit"] for r in new), "hits": sum(bool(r["cache_hit"]) for r in new),
            "benchmark_runs": sum(BENCH.values()) - benched, "by_kernel": count_by_kernel(new)}


def chosen() -> dict:
    """Per autotuned FLA kernel: its candidates, the config Triton's autotuner chose per tuning key, its benchmark
    runs and seconds in this process."""
    import importlib

    from kernelcache.exercise import vllm_gdn as vg
    from kernelcache.exercise.layers import autotuners

    found = {}
    for name in vg.FLA_MODULES:
        for kernel in autotuners(importlib.import_module(f"{vg.FLA}.{name}")):
            fn = kernel.base_fn.__name__
            found[fn] = {"configs": len(kernel.configs), "benchmark_runs": BENCH[fn],
                         "benchmark_s": round(BENCH_SECONDS[fn], 4),
                         "chosen": {str(key): str(config) for key, config in kernel.cache.items()}}
    return found


# -- the reference ----------------------------------------------------------------------------------------------


def reference(layer, outputs: dict, inputs: dict) -> dict:
    """The first prefill (fresh state) and the decode that continues it, against ``torch_gdn`` on the first
    prefill's tokens and one more; a failure of the reference itself is reported, not raised (the counts stand)."""
    import torch

    try:
        x = torch.cat([inputs["prefill"], inputs["decode-1"]]).cuda()
        want = torch_gdn(layer.attn, x)
        got = torch.cat([outputs["prefill"], outputs["decode-1"]]).cuda()
        first = inputs["prefill"].size(0)
        return {"prefill": error(got[:first], want[:first]), "decode": error(got[first:], want[first:])}
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
