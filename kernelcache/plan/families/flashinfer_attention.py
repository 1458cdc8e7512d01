"""vLLM's FlashInfer attention backend (exercise/vllm_flashinfer.py): the FlashInfer JIT modules its metadata builder
and forward ask for (XQA, FA2/FA3 prefill and decode, trtllm-gen's launcher), built with nvcc for the target, once
per sliding window of the model's layers."""

from __future__ import annotations

from ...errors import RecipeError
from ..family import MODEL, About, Family, ModelRole, Task
from ..releases import stable
from .attention import check_heads, window_tasks

# vLLM's FLASHINFER backend and its FlashInfer wrappers (exercise/vllm_flashinfer.py; the layer and KV cache
# are the attention family's).
CONTACTS = stable(
    "vllm.config:set_current_vllm_config", "vllm.forward_context:set_forward_context",
    "vllm.platforms.cuda:_get_backend_priorities", "vllm.platforms:current_platform", "vllm.utils:flashinfer",
    "vllm.v1.attention.backends.flashinfer:FlashInferBackend")

FLASHINFER = "FLASHINFER"  # vLLM's --attention-backend name of its FlashInfer backend
EXERCISE = "kernelcache.exercise.vllm_flashinfer"


def served(plan) -> bool:
    """Whether the plan names vLLM's FlashInfer backend (a model recipe then builds the path)."""
    return plan.attention_backend == FLASHINFER


class FlashInferAttention(Family):
    name = "flashinfer_attention"
    exercise = f"{EXERCISE}:flashinfer_attention"
    about = About(
        "the FlashInfer JIT modules of vLLM's FLASHINFER attention backend, once per sliding window",
        ("vllm.v1.attention.backends.flashinfer", "vLLM's FlashInfer attention backend"),
        reads=("model.num_attention_heads", "model.num_key_value_heads", "model.head_dim", "model.dtype",
               "model.sliding_window", "model.full_attention_layers", "model.logits_soft_cap", "kv_cache_dtype",
               "block_size", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "tensor_parallel_size",
               "attention_backend", "flashinfer_cubins"),
        note="needs --attention-backend FLASHINFER", gpu_check="flashinfer_attention", proven="H100",
        contacts=CONTACTS)
    unit = MODEL
    flashinfer = "tasks"
    model = ModelRole(rank=7)

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        return tuple(self.task(kwargs) for kwargs in window_tasks(plan, flashinfer=True))

    def check(self, plan, where: str) -> None:
        if plan.attention_backend not in (FLASHINFER, "auto"):
            raise RecipeError(f"{where}: the flashinfer_attention path builds vLLM's FlashInfer attention backend; "
                              f"it needs attention_backend = FLASHINFER (or auto, where vLLM picks FlashInfer), the "
                              f"plan has {plan.attention_backend}")
        check_heads(plan, "flashinfer_attention", where)

    def default(self, plan) -> bool:
        return plan.model is not None and served(plan)

    def from_model(self, model, plan) -> bool:
        return served(plan)


FAMILY = FlashInferAttention()
