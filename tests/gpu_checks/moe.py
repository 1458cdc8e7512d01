"""The fused-MoE check on a GPU (scripts/gpu/prove.py moe): vLLM's MoE layer on real tensors.

The layer is the one kernelcache's ``moe`` exercise builds (exercise/vllm_moe.py: ``FusedMoEFactory`` ->
``MoERunner.forward`` -> ``TritonExperts``) with the dims, dtype and tensor-parallel share of the bundle's task, on
the real CUDA platform, with the C ops the pure-Python vLLM tree lacks replaced by torch implementations
(exercise/fake_ops.py; listed under ``substitutions``). It runs token counts ``MS`` up to the task's
``max_num_batched_tokens``; weights and inputs come from seeded CUDA generators, so two processes compute the
same thing. ``reference`` checks a few token counts against a dense fp32 MoE.

``cpu-check`` runs without a GPU: the torch substitutes against vLLM's own buffer allocation
(``moe_align_block_size``'s wrapper) and, through a torch emulation of ``fused_moe_kernel``'s block semantics,
the whole pipeline against the dense reference.

    python tests/gpu_checks/moe.py cpu-check
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

MS = (1, 2, 3, 7, 16, 100, 256, 512, 1000)
REFERENCE_MS = (1, 7, 100)


# -- the model, dense (the reference) -------------------------------------------------------------


def route(logits, top_k: int):
    """Softmax routing, renormalised (vLLM's FusedTopKRouter for Qwen3-MoE), in fp32."""
    import torch

    scores = torch.softmax(logits.float(), dim=-1)
    ids = torch.topk(scores, top_k, dim=-1).indices
    weights = torch.gather(scores, 1, ids)
    return weights / weights.sum(dim=-1, keepdim=True), ids


def dense_moe(x, w13, w2, logits, top_k: int):
    """``sum_k w_k * (silu(x W_gate) * (x W_up)) W_down`` per token, fp32."""
    import torch

    weights, ids = route(logits, top_k)
    half = w13.size(1) // 2
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.size(0)):
        for k in range(top_k):
            e = int(ids[t, k])
            h = w13[e].float() @ x[t].float()
            act = torch.nn.functional.silu(h[:half]) * h[half:]
            out[t] += weights[t, k] * (w2[e].float() @ act)
    return out


def error(got, want) -> dict:
    diff = (got.float() - want.float()).abs()
    return {"max_abs": float(diff.max()), "max_rel": float(diff.max() / want.float().abs().max().clamp_min(1e-6))}


# -- the check (GPU) ---------------------------------------------------------------------------------------------


def check(tasks: list[dict], records: list[dict]) -> dict:
    """The first moe task's layer over every token count up to its ``max_num_batched_tokens``."""
    import torch

    from kernelcache.exercise import vllm_moe

    task = tasks[0]["kwargs"]
    substitutions = vllm_moe.prepare()
    layer = vllm_moe.make_layer(task["num_experts"], task["hidden_size"], task["intermediate_size"], task["top_k"],
                                task["dtype"], task.get("tensor_parallel_size", 1))
    fill_weights(layer)
    vllm_moe.start_workspace()
    ms = token_counts(task["max_num_batched_tokens"])
    calls, outputs = [], {}
    for m in ms:
        calls.append(timed_call(layer, m, records, outputs))
    return {"describe": vllm_moe.describe(layer, ms), "substitutions": substitutions, "calls": calls,
            "first_call_s": calls[0]["seconds"], "total_s": round(sum(c["seconds"] for c in calls), 4),
            "reference": reference(layer, outputs), "outputs": {f"m={m}": out for m, out in outputs.items()},
            "torch_cuda": torch.version.cuda}


def token_counts(most: int) -> list[int]:
    return [m for m in MS if m < most] + [most]


def fill_weights(layer) -> None:
    """Seeded weights, scaled so activations stay O(1) in bf16."""
    import torch

    w13, w2 = layer.weights
    generator = torch.Generator(device="cuda").manual_seed(1234)
    for weight, fan_in in ((w13, w13.size(2)), (w2, w2.size(2))):
        weight.data.copy_(torch.randn(weight.shape, generator=generator, device="cuda") / fan_in**0.5)


def inputs(layer, m: int):
    import torch

    generator = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn((m, layer.hidden_size), generator=generator, device="cuda").to(layer.dtype)
    logits = torch.randn((m, layer.num_experts), generator=generator, device="cuda").to(layer.dtype)
    return x, logits


def timed_call(layer, m: int, records: list[dict], outputs: dict) -> dict:
    import torch

    from kernelcache.exercise import vllm_moe

    x, logits = inputs(layer, m)
    seen = len(records)
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = vllm_moe.forward(layer, x, logits)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    outputs[m] = out.cpu()
    new = records[seen:]
    return {"m": m, "seconds": round(seconds, 4), "compiles": sum(not r["cache_hit"] for r in new),
            "hits": sum(bool(r["cache_hit"]) for r in new)}


def reference(layer, outputs: dict) -> dict:
    w13, w2 = layer.weights
    found = {}
    for m in REFERENCE_MS:
        if m in outputs:
            x, logits = inputs(layer, m)
            found[m] = error(outputs[m].to(x.device), dense_moe(x, w13, w2, logits, layer.top_k))
    return found


# -- cpu-check ------------------------------------------------------------------------------------


def emulate_gemm(a, b, c, sorted_ids, expert_ids, post_pad: int, top_k: int, block_m: int, weights=None):
    """What ``fused_moe_kernel`` computes: per M-block of ``sorted_ids`` (or, naive,
    per (token, slot) when ``sorted_ids`` is None), rows ``< num_valid`` get ``A[row // top_k] @ B[e]^T``,
    times the row's routing weight when ``weights`` is given; ``C`` is ``[M, top_k, N]`` flattened by row."""
    flat_c = c.view(-1, c.size(-1))
    num_valid = flat_c.size(0)
    for block in range(post_pad // block_m):
        if sorted_ids is None:
            rows = [block]
        else:
            rows = [int(r) for r in sorted_ids[block * block_m:(block + 1) * block_m] if int(r) < num_valid]
        e = int(expert_ids[block])
        for row in rows:
            value = b[e].float() @ a[row // top_k].float()
            flat_c[row] = value * (weights.flatten()[row] if weights is not None else 1)


def emulated_moe(x, w13, w2, logits, top_k: int, block_m: int, naive: bool):
    """vLLM's TritonExperts sequence with the torch substitutes and the emulated kernel, on CPU."""
    import torch
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size

    from kernelcache.exercise import fake_ops

    m, num_experts = x.size(0), w13.size(0)
    weights, ids = torch.empty(m, top_k), torch.empty(m, top_k, dtype=torch.int32)
    fake_ops.topk_softmax(weights, ids, torch.empty(m, top_k, dtype=torch.int32), logits, True)
    if naive:
        sorted_ids, expert_ids, post = None, ids.flatten(), ids.numel() * block_m
    else:
        sorted_ids, expert_ids, post_t = moe_align_block_size(ids, block_m, num_experts)
        post = int(post_t)
    n, k = w13.size(1), x.size(1)
    cache1 = torch.zeros(m, top_k, n)
    emulate_gemm(x, w13, cache1, sorted_ids, expert_ids, post, top_k, block_m)
    cache2 = torch.empty(m * top_k, n // 2)
    fake_ops.silu_and_mul(cache2, cache1.view(-1, n))
    cache3 = torch.zeros(m, top_k, k)
    emulate_gemm(cache2, w2, cache3, sorted_ids, expert_ids, post, 1, block_m, weights)
    out = torch.empty(m, k)
    fake_ops.moe_sum(cache3, out)
    return out


def cpu_check() -> dict:
    import torch

    from kernelcache.exercise import vllm_moe

    vllm_moe.prepare()
    torch.manual_seed(0)
    num_experts, hidden, inter, top_k = 16, 32, 24, 4
    w13 = torch.randn(num_experts, 2 * inter, hidden) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, inter) / inter**0.5
    checks = {"align_fits_vllm_buffers": align_fits(), "call_sites": call_sites(), "pipeline": {}}
    for m, naive in ((1, True), (1, False), (3, False), (17, False), (64, False)):
        x, logits = torch.randn(m, hidden), torch.randn(m, num_experts)
        got = emulated_moe(x, w13, w2, logits, top_k, 16, naive)
        checks["pipeline"][f"m={m},naive={naive}"] = error(got, dense_moe(x, w13, w2, logits, top_k))
    checks["ok"] = checks["align_fits_vllm_buffers"] and all(checks["call_sites"].values()) and all(
        e["max_rel"] < 1e-4 for e in checks["pipeline"].values())
    return checks


def call_sites() -> dict:
    """The substitutes through vLLM's own callers, on CPU tensors: router, activation, top-k sum."""
    import torch
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation, apply_moe_activation
    from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk

    x, logits = torch.randn(5, 8, dtype=torch.bfloat16), torch.randn(5, 16, dtype=torch.bfloat16)
    weights, ids, token_expert = fused_topk(x, logits, 4, renormalize=True)
    want_weights, want_ids = route(logits, 4)
    gate_up = torch.randn(20, 12, dtype=torch.bfloat16)
    act = apply_moe_activation(MoEActivation.SILU, torch.empty(20, 6, dtype=torch.bfloat16), gate_up)
    partial, summed = torch.randn(5, 4, 8, dtype=torch.bfloat16), torch.empty(5, 8, dtype=torch.bfloat16)
    ops.moe_sum(partial, summed)
    return {"fused_topk": bool(torch.equal(ids.long(), want_ids) and torch.allclose(weights, want_weights)
                               and ids.dtype == torch.int32 and token_expert[1, 2] == 2 * 5 + 1),
            "silu_and_mul": bool(torch.equal(act, torch.nn.functional.silu(gate_up[:, :6]) * gate_up[:, 6:])),
            "moe_sum": bool(torch.allclose(summed.float(), partial.float().sum(1), atol=3e-2))}


def align_fits() -> bool:
    """vLLM's ``moe_align_block_size`` wrapper (its buffer sizes) over many shapes, substitute inside: every
    routed slot appears once, padding is the sentinel, blocks hold one expert, totals fit the buffers."""
    import torch
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size

    for num_experts, top_k, block in ((128, 8, 16), (128, 8, 64), (8, 2, 32), (64, 1, 16)):
        for m in (1, 2, 5, 15, 16, 17, 100, 333):
            ids = torch.stack([torch.randperm(num_experts)[:top_k] for _ in range(m)]).to(torch.int32)
            sorted_ids, expert_ids, post = moe_align_block_size(ids, block, num_experts)
            if not _aligned(ids, sorted_ids, expert_ids, int(post), block):
                return False
    return True


def _aligned(ids, sorted_ids, expert_ids, post: int, block: int) -> bool:
    flat = ids.flatten()
    sentinel = flat.numel()
    if post % block or post > sorted_ids.numel() or post // block > expert_ids.numel():
        return False
    used = sorted_ids[:post]
    if sorted(used[used < sentinel].tolist()) != list(range(sentinel)) or (sorted_ids[post:] != sentinel).any():
        return False
    for b in range(post // block):
        rows = used[b * block:(b + 1) * block]
        if (flat[rows[rows < sentinel].long()] != expert_ids[b]).any():
            return False
    return True


if __name__ == "__main__":
    if sys.argv[1:] != ["cpu-check"]:
        sys.exit("usage: python tests/gpu_checks/moe.py cpu-check (the GPU check runs through scripts/gpu/prove.py)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    result = cpu_check()
    print(json.dumps(result, indent=1, default=str))
    sys.exit(0 if result["ok"] else 1)
