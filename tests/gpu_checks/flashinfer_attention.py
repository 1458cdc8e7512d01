"""The FlashInfer attention check on a GPU (scripts/gpu/prove.py flashinfer_attention): vLLM's FlashInfer backend
on real tensors, its JIT modules from the bundle or built by this machine's nvcc.

For each task of the bundle's plan (one per sliding window of the model) the layer is the one kernelcache's
``flashinfer_attention`` exercise builds (exercise/vllm_flashinfer.py: ``Attention`` with ``FlashInferBackend``,
``FlashInferMetadataBuilder``), with the task's shape, on vLLM's real CUDA platform. Each step is the builder
(``plan()``) then ``Attention.forward`` (``run()``), recorded by the exercise's ``recording`` with FlashInfer
building and loading for real; vLLM's artifactory check answers the task's ``cubins``. The KV cache starts from
seeded random values and each step's q/k/v come from a seeded CUDA generator (gpu_checks/attention.py ``inputs``), so
two processes compute the same thing; every step's output is kept.

Served from the bundle, FlashInfer finds each module through kernelcache's jit-cache provider with
``FLASHINFER_DISABLE_JIT=1``; cold, it builds each one with nvcc into the state's own empty workspace (its HOME).
prove.py points ``FLASHINFER_NVCC`` at a wrapper that logs each nvcc run to ``KERNELCACHE_PROVE_NVCC_LOG``; the
steps count them. Steps without a sliding window or soft-cap are checked against a dense fp32 causal attention
(gpu_checks/attention.py ``reference``).
"""

from __future__ import annotations

from attention import reference
from attention import timed_step as attention_step
from common import nvcc_runs

# The layer's KV cache holds max_num_seqs full-length sequences; at a recipe's 131072 tokens that is 137 GB for
# Llama-3.1-8B. No FlashInfer module's URI depends on the length (head dims, dtypes, page size, window and soft-cap
# do), so the check runs at most this many tokens per sequence.
MAX_MODEL_LEN = 8192


def batches(seqs: int, max_len: int, tokens: int) -> list[tuple[str, object]]:
    """The step list (kind, Batch), in run order: decode first (its first call loads or builds the decode module),
    then prefill (the prefill module), prefill over a cached prefix, mixed batches and CUDA-graph capture."""
    from kernelcache.exercise.vllm_attention import Batch

    def ctx(i: int, q: int) -> int:
        return max(q, (i * 2654435761) % max_len + 1)

    def uniform(n: int, q: int = 1, **kw) -> Batch:
        return Batch((q,) * n, tuple(ctx(i, q) for i in range(n)), **kw)

    steps = [("decode", uniform(n)) for n in (1, 2, 7, 16, 64, seqs) if n <= seqs]
    for length in (9, 100, 1000, 4096):
        if length <= min(tokens, max_len):
            steps.append(("prefill", Batch((length,), (length,))))
            steps.append(("prefill_prefix", Batch((length // 2,), (min(max_len, length + 37),))))
    for reqs in (2, 17, 64):
        chunk = min(tokens - (reqs - 1), max_len, 1024)
        if reqs <= seqs and chunk > 8:
            lens = (chunk,) + (1,) * (reqs - 1)
            steps.append(("mixed", Batch(lens, tuple(ctx(i, q) for i, q in enumerate(lens)))))
    steps += [("capture", uniform(n, capture=True)) for n in (1, 8, 64) if n <= seqs]
    return steps


def check(tasks: list[dict], records: list[dict]) -> dict:
    from kernelcache.exercise import vllm_flashinfer as vf

    substitutions = vf.prepare()
    found = {"substitutions": substitutions, "windows": {}, "outputs": {}}
    for task in tasks:
        layer = run_layer(task["kwargs"], records, found["outputs"])
        found["windows"][str(task["kwargs"]["sliding_window"])] = layer
    calls = [c for layer in found["windows"].values() for c in layer["calls"]]
    firsts: dict[str, float] = {}
    for call in calls:
        firsts.setdefault(call["kind"], call["seconds"])
    checked = [layer["reference"] for layer in found["windows"].values() if layer["reference"]["steps"]]
    return {**found, "first_call_s": calls[0]["seconds"], "first_call_by_kind_s": firsts,
            "total_s": round(sum(c["seconds"] for c in calls), 4), "steps": len(calls),
            "reference_ok": bool(checked) and all(r["ok"] for r in checked)}


def run_layer(task: dict, records: list[dict], outputs: dict) -> dict:
    """One layer (one sliding window) over the step list: per step its time, nvcc runs, compiles and output."""
    import torch

    from kernelcache.exercise import vllm_flashinfer as vf

    task = {**task, "max_model_len": min(task["max_model_len"], MAX_MODEL_LEN)}

    shape = vf.rank_shape(task["num_heads"], task["num_kv_heads"], task["head_size"], task["dtype"],
                          task["kv_cache_dtype"], task["block_size"], task["max_num_seqs"], task["max_model_len"],
                          task["max_num_batched_tokens"], task["sliding_window"], task["logits_soft_cap"],
                          task["tensor_parallel_size"])
    dense = not shape.sliding_window and not shape.logits_soft_cap  # what the fp32 reference computes
    recorder = vf.Recorder()
    calls, errors = [], {}
    with vf.artifactory(task["cubins"]), vf.recording(recorder, stand_in=False):
        state = vf.make_state(shape, recorder)
        state.kv_cache.normal_(generator=torch.Generator(device="cuda").manual_seed(7))
        for index, (kind, batch) in enumerate(batches(shape.max_num_seqs, shape.max_model_len,
                                                      shape.max_num_batched_tokens)):
            recorder.batch = kind
            call, out = timed_step(state, batch, index, records)
            calls.append({"kind": kind, "reqs": len(batch.query_lens) + batch.pad_reqs,
                          "tokens": batch.num_tokens, **call})
            outputs[f"w{shape.sliding_window}:{index:03d}:{kind}"] = out.cpu()
            if dense and not batch.capture:
                errors[f"{index}:{kind}"] = reference(state, batch, index, out)
    worst = max((e["max_abs"] for e in errors.values()), default=0.0)
    return {"decode_kernel": vf.describe_decode(state.builder), "max_model_len": shape.max_model_len,
            "modules": [{"name": s.name, "why": s.why, "first_batch": s.first_batch} for s in recorder.specs.values()],
            "left_out": recorder.left_out, "calls": calls,
            "reference": {"steps": len(errors), "worst_max_abs": worst, "tolerance": 3e-2, "ok": worst < 3e-2}}


def timed_step(state, batch, index: int, records: list[dict]):
    """gpu_checks/attention.py's step, on the same seeded q/k/v, through FlashInfer's backend; with its nvcc runs."""
    from kernelcache.exercise.vllm_flashinfer import step

    before = nvcc_runs()
    call, out = attention_step(state, batch, index, records, step)
    return {**call, "nvcc": nvcc_runs() - before}, out
