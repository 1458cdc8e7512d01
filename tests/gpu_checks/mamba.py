"""The Mamba-2 check on a GPU (scripts/gpu/prove.py mamba): vLLM's ``MambaMixer2`` on real tensors.

Kernelcache's autotune log (exercise/autotune_log.py) counts every candidate config Triton's autotuner times
(``Autotuner._bench``) and every lookup of a kept choice (``Autotuner.check_disk_cache``: a hit times nothing).
The layer, its state and its metadata are the ones kernelcache's ``mamba`` exercise builds (exercise/vllm_mamba.py:
``MambaMixer2`` -> ``Mamba2AttentionMetadataBuilder`` -> ``MambaMixer2.forward``) with the bundle's task (dims,
dtype, state dtype, sequences, batched tokens), natively: vLLM's CUDA platform, Triton's real autotuner. The C op
the pure-Python vLLM tree lacks (``_C::cutlass_scaled_mm_supports_fp8``, an import-time capability query) is
answered in Python (listed in the output). Steps (gpu_checks/common.py): the engine's profile run (a dummy step of
``max_num_batched_tokens`` tokens without attention metadata, in which vLLM warms the SSD kernels: where a
server's autotuner times them), then the requests. ``profile_s`` is the profile step (engine start),
``first_call_s`` the first request's. Weights and inputs are seeded, so two processes compute the same thing given
the same autotune choices; the chosen configs are recorded. ``reference`` checks the first prefill and its decode
against a plain fp32 torch Mamba-2 (conv, selective scan, gated group RMSNorm).
"""

from __future__ import annotations

import os

from common import autotune_json, count_by_kernel, error, steps, timed


def check(tasks: list[dict], records: list[dict]) -> dict:
    from kernelcache.exercise import autotune_log
    from kernelcache.exercise import vllm_mamba as vm
    from kernelcache.exercise.layers import tensor_parallel

    tuned: list[dict] = []
    autotune_log.install(also=tuned.append)
    task = tasks[0]["kwargs"]
    substitutions = vm.prepare()
    dims = vm.Dims(task["hidden_size"], task["mamba_num_heads"], task["mamba_head_dim"], task["ssm_state_size"],
                   task["n_groups"], task["conv_kernel"], task["chunk_size"], task["dtype"],
                   task["mamba_ssm_cache_dtype"], task["tensor_parallel_size"])
    seqs, tokens = task["max_num_seqs"], task["max_num_batched_tokens"]
    with tensor_parallel(dims.tp):
        layer = vm.make_layer(dims, seqs, tokens)
        calls, outputs, inputs = [], {}, {}
        for label, requests in steps(seqs, tokens):
            calls.append(timed_step(layer, label, vm.Batch(requests), records, tuned, outputs, inputs))
    return {"describe": vm.describe(layer), "substitutions": substitutions, "calls": calls,
            "profile_s": calls[0]["seconds"], "first_call_s": calls[1]["seconds"],
            "total_s": round(sum(c["seconds"] for c in calls), 4), "benchmarks": sum(c["benchmarks"] for c in calls),
            "autotune_hits": sum(c["autotune_hits"] for c in calls),
            "autotune_misses": sum(c["autotune_misses"] for c in calls),
            "autotune_cache": os.environ.get("TRITON_CACHE_AUTOTUNING"),
            "autotune_guard": os.environ.get("KERNELCACHE_AUTOTUNE_CHECK"), "autotune": chosen(),
            "autotune_json": autotune_json(), "reference": reference(layer, outputs, inputs), "outputs": outputs}


def timed_step(layer, label: str, batch, records: list[dict], tuned: list[dict], outputs: dict,
               inputs: dict) -> dict:
    from kernelcache.exercise import vllm_mamba as vm

    seen, looked = len(records), len(tuned)
    seconds = timed(vm, layer, label, batch, outputs, inputs)
    new, lookups = records[seen:], tuned[looked:]
    benched = [r for r in lookups if r["event"] == "autotune_bench"]
    kept = [r for r in lookups if r["event"] == "autotune"]
    return {"step": label, "tokens": batch.num_tokens, "seconds": round(seconds, 4),
            "compiles": sum(not r["cache_hit"] for r in new), "hits": sum(bool(r["cache_hit"]) for r in new),
            "benchmarks": len(benched), "autotune_hits": sum(r["hit"] for r in kept),
            "autotune_misses": sum(not r["hit"] for r in kept), "by_kernel": count_by_kernel(new)}


def chosen() -> dict:
    """Per autotuned SSD kernel: the config Triton's autotuner chose per tuning key and its benchmark seconds."""
    import importlib

    from kernelcache.exercise.layers import autotuners
    from kernelcache.exercise.vllm_mamba import OPS, SSD_MODULES

    found = {}
    for name in SSD_MODULES:
        for kernel in autotuners(importlib.import_module(f"{OPS}.{name}")):
            found[kernel.base_fn.__name__] = {
                "configs": len(kernel.configs), "bench_s": round(getattr(kernel, "bench_time", 0.0), 4),
                "chosen": {str(key): str(config) for key, config in kernel.cache.items()}}
    return found


# -- the reference ----------------------------------------------------------------------------------------------


def reference(layer, outputs: dict, inputs: dict) -> dict:
    """The first prefill (fresh state) and the decode that continues it, against ``torch_mamba2`` on the
    first prefill's tokens and one more."""
    import torch

    x = torch.cat([inputs["prefill"], inputs["decode-1"]]).cuda()
    want = torch_mamba2(layer.mixer, x)
    got = torch.cat([outputs["prefill"], outputs["decode-1"]]).cuda()
    first = inputs["prefill"].size(0)
    return {"prefill": error(got[:first], want[:first]), "decode": error(got[first:], want[first:])}


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
