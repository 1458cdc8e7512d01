"""What an exercise process runs: ``Task`` records, planned here (``vocab_tasks``) and run by exercise/worker.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from .recipe import BuildPlan

SAMPLER = "kernelcache.exercise.vllm_sampler"
SPEC_DECODE = "kernelcache.exercise.vllm_spec_decode"


@dataclass(frozen=True)
class Task:
    """``module:function`` plus keyword arguments; the function returns a JSON-able summary."""

    call: str
    kwargs: dict = field(default_factory=dict)
    label: str = ""


def vocab_tasks(plan: BuildPlan, vocab: int) -> tuple[Task, ...]:
    """The exercise tasks of one vocab size: the requested paths, registry first (the others then hit).

    The runtime paths run one batch size per specialization class of ``1..max_num_seqs*(spec+1)``,
    which the worker derives from vLLM's own split-count rule and the target's SM count. Empty when
    the plan's paths and dtypes select nothing (the processed paths need float32).
    """
    max_batch = plan.max_num_seqs * (plan.num_speculative_tokens + 1)
    processed = "float32" in plan.dtypes
    # Every logits dtype is also a model dtype: an fp32 model's raw logits reach MRV2's Gumbel kernel with
    # APPLY_TEMPERATURE=True, a key of its own (seen missing on the H200 when only bf16/fp16 were raw).
    model_dtypes = list(plan.dtypes)
    tasks = []
    if "registry" in plan.paths and processed:
        tasks.append(Task(f"{SAMPLER}:registry", {"vocab": vocab, "max_num_seqs": plan.max_num_seqs,
                                                   "num_speculative_tokens": plan.num_speculative_tokens},
                          label="registry"))
    if "mrv1" in plan.paths and processed:
        tasks.append(Task(f"{SAMPLER}:mrv1", {"vocab": vocab, "max_batch": max_batch, "modes": list(plan.modes),
                                               "seeded": plan.seeded, "unseeded": plan.unseeded and
                                               "flashinfer" not in plan.paths, "dtypes": list(plan.dtypes)},
                          label="mrv1"))
    if "mrv2" in plan.paths:
        tasks.append(Task(f"{SAMPLER}:mrv2", {
            "vocab": vocab, "max_batch": max_batch, "modes": list(plan.modes) if processed else [],
            "model_dtypes": model_dtypes, "max_num_reqs": plan.max_num_seqs, "min_p": plan.min_p,
            "fp64_gumbel": plan.fp64_gumbel}, label="mrv2"))
    if "mrv1_spec_decode" in plan.paths and plan.num_speculative_tokens > 0 and processed:
        tasks.append(Task(f"{SPEC_DECODE}:spec_decode", {
            "vocab": vocab, "max_num_seqs": plan.max_num_seqs, "num_speculative_tokens": plan.num_speculative_tokens,
            "max_model_len": plan.max_model_len, "dtypes": model_dtypes, "fp64_gumbel": plan.fp64_gumbel},
            label="mrv1_spec_decode"))
    return tuple(tasks)
