"""A hybrid model's gated-delta-net layers (exercise/vllm_gdn.py): ``QwenGatedDeltaNetAttention`` over the
profile run, decode, prefill and mixed batches, once per dtype they run in, every FLA autotune candidate."""

from __future__ import annotations

from dataclasses import asdict

from ...errors import RecipeError
from ..family import MODEL, Family, Task
from ..model import GDN_ARCHITECTURES

# vLLM's --gdn-prefill-backend for NVIDIA GPUs; auto: vLLM's choice (FlashInfer's GDN prefill on Hopper, and on
# Blackwell with 128-dim keys and CUDA 13; the FLA Triton kernels otherwise: _resolve_gdn_prefill_backend).
GDN_PREFILL_BACKENDS = ("auto", "triton", "flashinfer")


def _tasks(plan, vocab: int) -> tuple[Task, ...]:
    """Once per dtype the layers run in, with the serving settings their kernels depend on: drafts, the prefill
    backend, and the attention layers' page, which the GDN state's page is padded to (its block stride is a
    constexpr of the decode kernels)."""
    model = plan.model
    if model is None or model.gdn is None:
        return ()
    return tuple(Task("kernelcache.exercise.vllm_gdn:gdn", {
        **asdict(model.gdn), "hidden_size": model.hidden_size, "dtype": dtype, "max_num_seqs": plan.max_num_seqs,
        "max_num_batched_tokens": plan.max_num_batched_tokens, "tensor_parallel_size": plan.tensor_parallel_size,
        "num_speculative_tokens": plan.num_speculative_tokens, "gdn_prefill_backend": plan.gdn_prefill_backend,
        "num_key_value_heads": model.num_key_value_heads, "head_dim": model.head_dim,
        "attention_backend": plan.attention_backend, "kv_cache_dtype": plan.kv_cache_dtype,
        "block_size": plan.block_size, "max_model_len": plan.max_model_len}, label="gdn")
        for dtype in plan.layer_dtypes)


def _check(plan, where: str) -> None:
    model = plan.model
    if model is None or model.gdn is None:
        what = "no model" if model is None else f"{model.name} ({model.architecture}), which has none"
        raise RecipeError(f"{where}: the gdn path needs a model with gated-delta-net layers (architectures: "
                          f"{', '.join(GDN_ARCHITECTURES)}), the plan has {what}")
    heads = (model.gdn.linear_num_key_heads, model.gdn.linear_num_value_heads)
    if any(h % plan.tensor_parallel_size for h in heads):
        raise RecipeError(f"{where}: tensor_parallel_size {plan.tensor_parallel_size} does not divide "
                          f"{model.name}'s {heads[0]} key / {heads[1]} value heads of its gated-delta-net layers")


def _from_model(model, plan) -> bool:
    return model.is_gdn


FAMILY = Family(
    "gdn", "a hybrid model's gated-delta-net layers (QwenGatedDeltaNetAttention), every FLA autotune candidate",
    "kernelcache.exercise.vllm_gdn:gdn",
    ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "vLLM's gated-delta-net layer"),
    reads=("model.gdn", "model.hidden_size", "model.num_key_value_heads", "model.head_dim", "model.dtype", "dtypes",
           "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size", "num_speculative_tokens",
           "gdn_prefill_backend", "attention_backend", "kv_cache_dtype", "block_size", "max_model_len"),
    unit=MODEL, tasks=_tasks, note="needs a gated-delta-net model: Qwen3-Next, Qwen3.5",
    default=lambda plan: bool(plan.model and plan.model.is_gdn), from_model=_from_model, model_owned=True,
    model_rank=3, check=_check, probe="tests/probes/gdn_keys.py", gpu_check="gdn")
