"""The attention check on a GPU (scripts/gpu/prove.py attention): vLLM's Triton attention backend on real tensors.

The layer is the one kernelcache's ``attention`` exercise builds (exercise/vllm_attention.py: ``Attention`` with
``TritonAttentionBackend``, the KV cache in the engine's resolved layout, Model Runner V2's buffers,
``TritonAttentionMetadataBuilder``) with the shape of the bundle's task (its full-attention one when the model
also has sliding-window layers), on vLLM's real CUDA platform. The KV cache starts from seeded random values and
each step's q/k/v come from a seeded CUDA generator, so two processes compute the same thing; every step's output
is kept. Steps: CUDA-graph capture builds, uniform decode of 1..64 and larger batches (some padded to a capture
size), short queries (3D with several query tokens), prefills with and without a cached prefix, and mixed
prefill+decode batches. ``reference`` checks every non-capture step against a dense fp32 causal attention over
the cache contents (gathered through the block table).
"""

from __future__ import annotations

import time


def batches(seqs: int, max_len: int, tokens: int) -> list[tuple[str, object]]:
    """The step list (kind, Batch), in run order."""
    from kernelcache.exercise.vllm_attention import Batch

    def ctx(i: int, q: int) -> int:
        return max(q, (i * 2654435761) % max_len + 1)

    def uniform(n: int, q: int = 1, **kw) -> Batch:
        return Batch((q,) * n, tuple(ctx(i, q) for i in range(n)), **kw)

    steps = [("capture", uniform(n, capture=True)) for n in (1, 8, 16, 64) if n <= seqs]
    steps += [("decode", uniform(n)) for n in [*range(1, min(seqs, 64) + 1), 100, 128, 200, seqs] if n <= seqs]
    steps += [("decode_padded", uniform(n, pad_reqs=p)) for n, p in ((3, 1), (13, 3), (20, 4), (250, 6))
              if n + p <= seqs]
    shorts = ((1, 3), (2, 8), (5, 2), (4, 4), (20, 5))
    steps += [("short", uniform(n, q)) for n, q in shorts if n <= seqs and n * q <= tokens]
    for length in (9, 100, 1000, 4096, 8192):
        if length <= min(tokens, max_len):
            steps.append(("prefill", Batch((length,), (length,))))
            steps.append(("prefill_prefix", Batch((length // 2,), (min(max_len, length + 37),))))
    for reqs in (2, 17, 64, seqs):
        chunk = min(tokens - (reqs - 1), max_len)
        if reqs <= seqs and chunk > 8:
            lens = (chunk,) + (1,) * (reqs - 1)
            steps.append(("mixed", Batch(lens, tuple(ctx(i, q) for i, q in enumerate(lens)))))
    return steps


def check(tasks: list[dict], records: list[dict]) -> dict:
    import torch

    from kernelcache.exercise import vllm_attention as va

    task = next((t["kwargs"] for t in tasks if not t["kwargs"]["sliding_window"]), tasks[0]["kwargs"])
    substitutions = va.prepare()
    shape = va.rank_shape(task["num_heads"], task["num_kv_heads"], task["head_size"], task["dtype"],
                          task["kv_cache_dtype"], task["block_size"], task["max_num_seqs"], task["max_model_len"],
                          task["max_num_batched_tokens"], task["sliding_window"], task["tensor_parallel_size"],
                          list(va.ENTRIES))
    state = va.make_state(shape)
    torch.manual_seed(0)
    state.kv_cache.normal_(generator=torch.Generator(device="cuda").manual_seed(7))
    calls, outputs, errors = [], {}, {}
    for index, (kind, batch) in enumerate(batches(shape.max_num_seqs, shape.max_model_len,
                                                  shape.max_num_batched_tokens)):
        call, out = timed_step(state, batch, index, records)
        calls.append({"kind": kind, "reqs": len(batch.query_lens) + batch.pad_reqs, "tokens": batch.num_tokens,
                      **call})
        outputs[f"{index:03d}:{kind}"] = out.cpu()
        if not batch.capture:
            errors[f"{index}:{kind}"] = reference(state, batch, index, out)
    worst = max(e["max_abs"] for e in errors.values())
    return {"describe": va.describe(state), "substitutions": substitutions, "calls": calls,
            "first_call_s": calls[0]["seconds"], "total_s": round(sum(c["seconds"] for c in calls), 4),
            "reference": {"steps": len(errors), "worst_max_abs": worst, "tolerance": 3e-2, "ok": worst < 3e-2},
            "outputs": outputs}


def inputs(state, batch, index: int):
    import torch

    from kernelcache.exercise.vllm_attention import qkv

    return qkv(state, batch.num_tokens, torch.Generator(device="cuda").manual_seed(1000 + index))


def timed_step(state, batch, index: int, records: list[dict], step=None):
    """One step (``step``: vllm_attention's, or another backend's of the same shape) on its seeded q/k/v, synchronized
    and timed, with the compiles and hits it caused."""
    import torch

    from kernelcache.exercise import vllm_attention

    step = step or vllm_attention.step
    tensors = inputs(state, batch, index)
    seen = len(records)
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = step(state, batch, tensors)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    new = records[seen:]
    return ({"seconds": round(seconds, 4), "compiles": sum(not r["cache_hit"] for r in new),
             "hits": sum(bool(r["cache_hit"]) for r in new), "keys": sorted({r["key"] for r in new})}, out)


def reference(state, batch, index: int, out) -> dict:
    """Dense fp32 causal attention per request over the cache (after the step's write), vs the output."""
    import torch

    shape = state.shape
    q = inputs(state, batch, index)[0].float().view(-1, shape.num_heads, shape.head_size)
    key_cache, value_cache = state.kv_cache.transpose(1, 2).split(shape.head_size, dim=-1)
    group = shape.num_heads // shape.num_kv_heads
    got = out.float().view(-1, shape.num_heads, shape.head_size)
    start, worst = 0, 0.0
    for req, (n, s) in enumerate(zip(batch.query_lens, batch.seq_lens)):
        blocks = state.block_table[req, : -(-s // shape.block_size)].long()
        k = key_cache[blocks].reshape(-1, shape.num_kv_heads, shape.head_size)[:s].float()
        v = value_cache[blocks].reshape(-1, shape.num_kv_heads, shape.head_size)[:s].float()
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:start + n], k) * shape.head_size**-0.5
        positions = torch.arange(s - n, s, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(s, device=q.device)[None, :] > positions, float("-inf"))
        want = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
        worst = max(worst, float((got[start:start + n] - want).abs().max()))
        start += n
    return {"max_abs": round(worst, 6)}
