"""The sampler families: vLLM's JIT warmup registry, the V1 (MRV1) sampler, Model Runner V2's Gumbel sampler
(exercise/vllm_sampler.py), and the FlashInfer sampling module (exercise/flashinfer.py, built beside the Triton
tasks). The processed paths (registry, mrv1) run on float32 logits."""

from __future__ import annotations

from ..family import Family, Task

EXERCISE = "kernelcache.exercise.vllm_sampler"
PROBE = "tests/probes/vllm_keys.py"


def max_batch(plan) -> int:
    """The largest batch a step samples: every sequence with all its drafts."""
    return plan.max_num_seqs * (plan.num_speculative_tokens + 1)


def processed(plan) -> bool:
    """Whether the plan has float32 logits, what the processed paths (top-k/top-p) sample."""
    return "float32" in plan.dtypes


def _registry(plan, vocab: int) -> tuple[Task, ...]:
    if not processed(plan):
        return ()
    return (Task(f"{EXERCISE}:registry", {"vocab": vocab, "max_num_seqs": plan.max_num_seqs,
                                          "num_speculative_tokens": plan.num_speculative_tokens}, label="registry"),)


def _mrv1(plan, vocab: int) -> tuple[Task, ...]:
    if not processed(plan):
        return ()
    return (Task(f"{EXERCISE}:mrv1", {"vocab": vocab, "max_batch": max_batch(plan), "modes": list(plan.modes),
                                      "seeded": plan.seeded, "unseeded": plan.unseeded and
                                      "flashinfer" not in plan.paths, "dtypes": list(plan.dtypes)},
                 label="mrv1"),)


def _mrv2(plan, vocab: int) -> tuple[Task, ...]:
    # Every logits dtype is also a model dtype: an fp32 model's raw logits reach MRV2's Gumbel kernel with
    # APPLY_TEMPERATURE=True, a key of its own (seen missing on the H200 when only bf16/fp16 were raw).
    return (Task(f"{EXERCISE}:mrv2", {
        "vocab": vocab, "max_batch": max_batch(plan), "modes": list(plan.modes) if processed(plan) else [],
        "model_dtypes": list(plan.dtypes), "max_num_reqs": plan.max_num_seqs, "min_p": plan.min_p,
        "fp64_gumbel": plan.fp64_gumbel}, label="mrv2"),)


REGISTRY = Family(
    "registry", "every top-k/top-p key vLLM's JIT warmup registry enumerates", f"{EXERCISE}:registry",
    ("vllm.model_executor.warmup.jit_warmup", "vLLM's JIT warmup registry"),
    reads=("vocab", "max_num_seqs", "num_speculative_tokens", "dtypes"), tasks=_registry, probe=PROBE,
    gpu_check="sampler", proven="H200")
MRV1 = Family(
    "mrv1", "the V1 Sampler with seeded and unseeded requests, every batch class", f"{EXERCISE}:mrv1",
    ("vllm.v1.sample.sampler", "the V1 (MRV1) Sampler"),
    reads=("vocab", "max_num_seqs", "num_speculative_tokens", "modes", "seeded", "unseeded", "dtypes", "paths"),
    tasks=_mrv1, probe=PROBE, gpu_check="sampler", proven="H200")
MRV2 = Family(
    "mrv2", "Model Runner V2's temperature/min-p/top-k/top-p and Gumbel chain, raw-logits Gumbel",
    f"{EXERCISE}:mrv2", ("vllm.v1.worker.gpu.sample.gumbel", "Model Runner V2's Gumbel sampler"),
    reads=("vocab", "max_num_seqs", "num_speculative_tokens", "modes", "dtypes", "min_p", "fp64_gumbel"),
    tasks=_mrv2, probe=PROBE, gpu_check="sampler", proven="H200")
FLASHINFER = Family(
    "flashinfer", "FlashInfer's sampling module (a CUDA module, built beside the Triton tasks)",
    f"{EXERCISE}:flashinfer", ("flashinfer", "flashinfer-python"), reads=("vocab",), unit="",
    proven="H200 (cross builds)")
