"""A hybrid model's Mamba-2 layers (exercise/vllm_mamba.py): ``MambaMixer2`` over the engine's profile run,
decode, prefill and mixed batches, once per dtype the layers run in, every autotune candidate of the SSD
kernels compiled."""

from __future__ import annotations

from dataclasses import asdict

from ...errors import RecipeError
from ..family import MODEL, Family, Task
from ..model import MAMBA_CONFIG_NAMES


def _tasks(plan, vocab: int) -> tuple[Task, ...]:
    model = plan.model
    if model is None or model.mamba is None:
        return ()
    return tuple(Task("kernelcache.exercise.vllm_mamba:mamba", {
        **asdict(model.mamba), "hidden_size": model.hidden_size, "dtype": dtype, "max_num_seqs": plan.max_num_seqs,
        "max_num_batched_tokens": plan.max_num_batched_tokens, "tensor_parallel_size": plan.tensor_parallel_size},
        label="mamba") for dtype in plan.layer_dtypes)


def _check(plan, where: str) -> None:
    model = plan.model
    if model is None or model.mamba is None:
        what = "no model" if model is None else f"{model.name} ({model.architecture}), which has none"
        raise RecipeError(f"{where}: the mamba path needs a hybrid model with Mamba-2 layers (architectures: "
                          f"{', '.join(MAMBA_CONFIG_NAMES)}), the plan has {what}")
    if model.mamba.mamba_num_heads % plan.tensor_parallel_size:
        raise RecipeError(f"{where}: tensor_parallel_size {plan.tensor_parallel_size} does not divide "
                          f"{model.name}'s {model.mamba.mamba_num_heads} Mamba heads")


def _from_model(model, plan) -> bool:
    return model.is_hybrid


FAMILY = Family(
    "mamba", "a hybrid model's Mamba-2 layers (MambaMixer2), every SSD autotune candidate",
    "kernelcache.exercise.vllm_mamba:mamba",
    ("vllm.model_executor.layers.mamba.mamba_mixer2", "vLLM's Mamba-2 mixer"),
    reads=("model.mamba", "model.hidden_size", "model.dtype", "dtypes", "max_num_seqs", "max_num_batched_tokens",
           "tensor_parallel_size"),
    unit=MODEL, tasks=_tasks, note="needs a hybrid model",
    default=lambda plan: bool(plan.model and plan.model.is_hybrid), from_model=_from_model, model_owned=True,
    model_rank=2, check=_check, probe="tests/probes/mamba_keys.py", gpu_check="mamba")
