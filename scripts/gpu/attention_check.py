#!/usr/bin/env python3
"""The TRITON_ATTN proof on a GPU: vLLM's Triton attention backend on real tensors, with or without a bundle.

One fresh process per run (``run``): ``TRITON_CACHE_DIR`` is set before Triton is imported, kernelcache's
compile listener counts every ``compile()`` call (``cache_hit`` or a real compile) and every gcc launcher
build, and the layer is the one kernelcache's ``attention`` exercise builds (exercise/vllm_attention.py:
``Attention`` with ``TritonAttentionBackend``, the KV cache in the engine's resolved layout, Model Runner
V2's buffers, ``TritonAttentionMetadataBuilder``), on vLLM's real CUDA platform. The KV cache starts from
seeded random values and each step's q/k/v come from a seeded CUDA generator, so two runs compute the same
thing; outputs are saved for ``compare``. Steps: CUDA-graph capture builds, uniform decode of 1..64 and
larger batches (some padded to a capture size), short queries (3D with several query tokens), prefills with
and without a cached prefix, and mixed prefill+decode batches. ``reference`` checks every non-capture step
against a dense fp32 attention over the cache contents (gathered through the block table, causal).

    python scripts/gpu/attention_check.py run --cache-dir D --out R.json --outputs O.pt [shape options]
    python scripts/gpu/attention_check.py compare A.pt B.pt
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LLAMA_31_8B = {"num_heads": 32, "num_kv_heads": 8, "head_size": 128}


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


def run(args) -> dict:
    os.environ["TRITON_CACHE_DIR"] = args.cache_dir
    import torch

    torch.zeros(1, device="cuda")
    from kernelcache.exercise import listener

    records: list[dict] = []
    gcc = Path(args.out).with_suffix(".gcc.jsonl")
    listener.install(also=records.append)
    listener.count_builds(str(gcc))
    from kernelcache.exercise import vllm_attention as va

    substitutions = va.prepare()
    shape = va.rank_shape(args.num_heads, args.num_kv_heads, args.head_size, args.dtype, "auto", args.block_size,
                          args.max_num_seqs, args.max_model_len, args.max_num_batched_tokens, 0, 1, list(va.ENTRIES))
    state = va.make_state(shape, num_blocks=args.num_blocks or None)
    torch.manual_seed(0)
    state.kv_cache.normal_(generator=torch.Generator(device="cuda").manual_seed(7))
    calls, outputs, errors = [], {}, {}
    for index, (kind, batch) in enumerate(batches(shape.max_num_seqs, shape.max_model_len,
                                                  shape.max_num_batched_tokens)):
        call, out = timed_step(state, batch, index, records)
        calls.append({"kind": kind, "reqs": len(batch.query_lens) + batch.pad_reqs, "tokens": batch.num_tokens,
                      **call})
        outputs[index] = out.cpu()
        if not batch.capture:
            errors[f"{index}:{kind}"] = check(state, batch, index, out)
    torch.save(outputs, args.outputs)
    worst = max(e["max_abs"] for e in errors.values())
    return {"cache_dir": args.cache_dir, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "describe": va.describe(state),
            "substitutions": substitutions, "calls": calls, "first_call_s": calls[0]["seconds"],
            "total_s": round(sum(c["seconds"] for c in calls), 4),
            "compiles": sum(c["compiles"] for c in calls), "hits": sum(c["hits"] for c in calls),
            "gcc_builds": len(listener.read(str(gcc))), "keys": sorted({k for c in calls for k in c["keys"]}),
            "reference": {"steps": len(errors), "worst_max_abs": worst, "tolerance": 3e-2,
                          "ok": worst < 3e-2, "per_step": errors}}


def inputs(state, batch, index: int):
    import torch

    from kernelcache.exercise.vllm_attention import qkv

    return qkv(state, batch.num_tokens, torch.Generator(device="cuda").manual_seed(1000 + index))


def timed_step(state, batch, index: int, records: list[dict]):
    import torch

    from kernelcache.exercise.vllm_attention import step

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


def check(state, batch, index: int, out) -> dict:
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


def compare(a: str, b: str) -> dict:
    import torch

    left, right = torch.load(a), torch.load(b)
    per_step = {i: bool(torch.equal(left[i], right[i])) for i in left if i in right}
    return {"identical": bool(per_step) and all(per_step.values()) and left.keys() == right.keys(),
            "steps": len(per_step), "differing": [i for i, same in per_step.items() if not same]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("--cache-dir", required=True)
    one.add_argument("--out", required=True)
    one.add_argument("--outputs", required=True)
    one.add_argument("--dtype", default="bfloat16")
    one.add_argument("--block-size", type=int, default=16)
    one.add_argument("--max-num-seqs", type=int, default=256)
    one.add_argument("--max-model-len", type=int, default=8192)
    one.add_argument("--max-num-batched-tokens", type=int, default=8192)
    one.add_argument("--num-blocks", type=int, default=0, help="KV-cache blocks (default: every request owns its own)")
    for name, value in LLAMA_31_8B.items():
        one.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    two = sub.add_parser("compare")
    two.add_argument("a")
    two.add_argument("b")
    args = parser.parse_args()
    if args.command == "run":
        result = run(args)
        Path(args.out).write_text(json.dumps(result, indent=1))
        result = {**result, "reference": {k: v for k, v in result["reference"].items() if k != "per_step"}}
    else:
        result = compare(args.a, args.b)
    print(json.dumps({k: v for k, v in result.items() if k != "calls"}, indent=1, default=str)[:6000])
    return 0 if result.get("identical", result.get("reference", {}).get("ok", True)) else 1


if __name__ == "__main__":
    sys.exit(main())
