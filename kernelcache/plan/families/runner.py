"""Model Runner V2's own kernels (exercise/vllm_runner.py): its request state, input buffers, block tables and
sampler stepped through prefill and decode."""

from __future__ import annotations

from ..family import Family, Task


def _tasks(plan, vocab: int) -> tuple[Task, ...]:
    return (Task("kernelcache.exercise.vllm_runner:runner", {
        "vocab": vocab, "max_num_seqs": plan.max_num_seqs, "max_model_len": plan.max_model_len,
        "max_num_batched_tokens": plan.max_num_batched_tokens, "block_size": plan.block_size,
        "dtypes": list(plan.dtypes)}, label="runner"),)


def _from_model(model, plan) -> bool:
    return True


FAMILY = Family(
    "runner", "Model Runner V2's own kernels: request state, input buffers, block tables, its sampler",
    "kernelcache.exercise.vllm_runner:runner", ("vllm.v1.worker.gpu.input_batch", "Model Runner V2's input batch"),
    reads=("vocab", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "block_size", "dtypes"),
    tasks=_tasks, note="Model Runner V2's own kernels", from_model=_from_model, model_rank=0,
    probe="tests/probes/runner_keys.py", gpu_check="runner", proven="H200")
