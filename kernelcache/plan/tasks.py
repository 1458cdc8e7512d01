"""What an exercise process runs: ``Task`` records, planned here and run by exercise/worker.py.

A plan's work comes in units, one exercise process each (``plan_units``): one per vocab size (the
sampler, runner and speculative-decoding paths, ``vocab_tasks``) and one for the model's own layers
(``model_tasks``: the fused-MoE, Triton-attention, Mamba-2 and gated-delta-net kernels), which do not depend on
the vocab."""

from __future__ import annotations

from . import families
from .family import MODEL, VOCAB, Task
from .recipe import BuildPlan

SAMPLER = "kernelcache.exercise.vllm_sampler"  # the sampler's module: the platform setup and FlashInfer tasks
__all__ = ["SAMPLER", "device_name_modules", "Task", "model_tasks", "plan_units", "vocab_tasks"]


def device_name_modules() -> dict[str, str]:
    """The exercise module of each path vLLM configures by device name (``Family.keys_follow_device``)."""
    return {path: families.get(path).exercise.partition(":")[0] for path in families.device_keyed()}


def vocab_tasks(plan: BuildPlan, vocab: int) -> tuple[Task, ...]:
    """The exercise tasks of one vocab size: the requested paths, registry first (the others then hit).

    The runtime paths run one batch size per specialization class of ``1..max_num_seqs*(spec+1)``,
    which the worker derives from vLLM's own split-count rule and the target's SM count. Empty when
    the plan's paths and dtypes select nothing (the processed paths need float32).
    """
    return tuple(task for family in families.families() if family.unit == VOCAB
                 for task in family.planned(plan, vocab))


def model_tasks(plan: BuildPlan) -> tuple[Task, ...]:
    """The model's layers: fused MoE, Mamba-2 and gated delta net once per dtype they run in, Triton attention
    once per sliding window."""
    return tuple(task for family in families.families() if family.unit == MODEL for task in family.planned(plan))


def plan_units(plan: BuildPlan) -> list[tuple[str, tuple[Task, ...]]]:
    """(name, tasks) per exercise process: each vocab size, then the model's layers; empty units dropped."""
    units = [(str(v.size), vocab_tasks(plan, v.size)) for v in plan.vocabs]
    units.append(("model", model_tasks(plan)))
    return [(name, tasks) for name, tasks in units if tasks]
