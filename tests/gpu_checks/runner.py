"""The runner check on a GPU (scripts/gpu/prove.py runner): Model Runner V2's own kernels on real tensors.

It runs ``kernelcache.exercise.vllm_runner.runner`` natively with the bundle's task (real CUDA tensors, real UVA
buffers: vLLM's C extension is absent on the GPU box, so the device view of pinned memory comes from
``fake_runner_ops.uva_view``, the same pointer the C op returns), torch and Triton RNG seeded. Through the
exercise's watch points (exercise/watch.py) it times every sampler call and keeps every sampled token and logprob
the sampler returned, as outputs.
"""

from __future__ import annotations

import time


def check(tasks: list[dict], records: list[dict]) -> dict:
    import torch

    from kernelcache.exercise.vllm_runner import runner
    from kernelcache.exercise.watch import watching

    torch.manual_seed(0)
    outputs: dict = {}
    seconds: list[float] = []
    marks: list[float] = []

    def watch(point: str, values: dict) -> None:
        if point == "runner.sample":
            torch.cuda.synchronize()
            marks.append(time.perf_counter())
        elif point == "runner.sampled":
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - marks[-1])
            keep(outputs, values["output"])

    with watching(watch):
        summary = runner(**tasks[0]["kwargs"])
    return {"summary": summary, "sampler_calls": len(seconds), "first_sampler_call_s": seconds[0] if seconds else None,
            "outputs": outputs}


def keep(outputs: dict, output) -> None:
    """The sampled tokens and, when asked for, the logprob token ids of one sampler call."""
    n = len(outputs)
    outputs[f"{n:04d}:sampled"] = output.sampled_token_ids.cpu()
    if output.logprobs_tensors is not None:
        outputs[f"{n:04d}:logprob_ids"] = output.logprobs_tensors.logprob_token_ids.cpu()
