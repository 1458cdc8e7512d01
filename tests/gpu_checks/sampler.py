"""The sampler check on a GPU (scripts/gpu/prove.py sampler): vLLM's registry warmup, the V1 Sampler and Model
Runner V2's sampling chain on real tensors.

It runs the bundle's sampler tasks natively, as the build ran them under the fake target: ``registry`` (vLLM's
``JitWarmupRegistry`` over its top-k/top-p registrations), ``mrv1`` (``Sampler()`` per batch class, mode and
dtype, seeded and unseeded) and ``mrv2`` (temperature, min-p, top-k/top-p and Gumbel sampling, raw-logits Gumbel),
torch seeded. Through the exercise's watch point (exercise/watch.py) it keeps every sampled token as an output;
each task is timed (``first_task_s``: the first, what a server's first sampler calls pay).
"""

from __future__ import annotations

import importlib
import time


def check(tasks: list[dict], records: list[dict]) -> dict:
    import torch

    from kernelcache.exercise.watch import watching

    torch.manual_seed(0)
    outputs: dict = {}

    def watch(point: str, values: dict) -> None:
        if point == "sampler.sampled":
            outputs[f"{len(outputs):05d}"] = values["tokens"].cpu()

    timed = []
    with watching(watch):
        for task in tasks:
            module, _, function = task["call"].partition(":")
            seen = len(records)
            started = time.perf_counter()
            summary = getattr(importlib.import_module(module), function)(**task["kwargs"])
            torch.cuda.synchronize()
            timed.append({"label": task["label"], "seconds": round(time.perf_counter() - started, 4),
                          "compiles": sum(not r["cache_hit"] for r in records[seen:]),
                          "hits": sum(bool(r["cache_hit"]) for r in records[seen:]), "summary": summary})
    return {"tasks": timed, "first_task_s": timed[0]["seconds"] if timed else None, "outputs": outputs}
