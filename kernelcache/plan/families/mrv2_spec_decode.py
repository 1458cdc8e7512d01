"""Model Runner V2's speculative decoding (exercise/vllm_mrv2_spec_decode.py): its rejection sampler, the
drafted sampler and the EAGLE speculator over warmup and drafted batches."""

from __future__ import annotations

from ..family import Family, Task


def _tasks(plan, vocab: int) -> tuple[Task, ...]:
    if plan.num_speculative_tokens < 1:
        return ()
    return (Task("kernelcache.exercise.vllm_mrv2_spec_decode:mrv2_spec_decode", {
        "vocab": vocab, "max_num_seqs": plan.max_num_seqs, "num_speculative_tokens": plan.num_speculative_tokens,
        "max_model_len": plan.max_model_len, "max_num_batched_tokens": plan.max_num_batched_tokens,
        "block_size": plan.block_size, "dtypes": list(plan.dtypes)}, label="mrv2_spec_decode"),)


FAMILY = Family(
    "mrv2_spec_decode", "Model Runner V2's rejection sampler, drafted sampler and EAGLE speculator",
    "kernelcache.exercise.vllm_mrv2_spec_decode:mrv2_spec_decode",
    ("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "Model Runner V2's speculative decoding"),
    reads=("vocab", "max_num_seqs", "num_speculative_tokens", "max_model_len", "max_num_batched_tokens",
           "block_size", "dtypes"),
    tasks=_tasks, note="need drafts", needs_drafts=True, probe="tests/probes/mrv2_spec_decode_keys.py",
    gpu_check="mrv2_spec_decode", proven="H200")
