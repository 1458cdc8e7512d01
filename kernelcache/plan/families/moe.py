"""vLLM's fused-MoE layer (exercise/vllm_moe.py): ``FusedMoEFactory`` -> ``TritonExperts`` for every token count,
once per dtype the model's layers run in, with vLLM's tuned tile configs for the profile's device name."""

from __future__ import annotations

from ...errors import RecipeError
from ..family import MODEL, About, Family, ModelRole, Task
from ..releases import stable

# The fused-MoE layer as the model builds it and its Triton experts (exercise/vllm_moe.py).
CONTACTS = stable(
    "vllm._custom_ops", "vllm.config:VllmConfig", "vllm.config:set_current_vllm_config",
    "vllm.forward_context:set_forward_context", "vllm.model_executor.layers.fused_moe.fused_moe",
    "vllm.model_executor.layers.fused_moe.fused_moe:fused_experts",
    "vllm.model_executor.layers.fused_moe.fused_moe:fused_experts_impl",
    "vllm.model_executor.layers.fused_moe.fused_moe:get_config_file_name",
    "vllm.model_executor.layers.fused_moe.fused_moe:try_get_optimal_moe_config",
    "vllm.model_executor.layers.fused_moe.layer:FusedMoEFactory",
    "vllm.model_executor.layers.fused_moe.router.fused_topk_router:fused_topk",
    "vllm.model_executor.layers.fused_moe.runner:moe_runner", "vllm.model_executor.layers.fused_moe:fused_moe",
    "vllm.v1.worker:workspace")


class Moe(Family):
    name = "moe"
    exercise = "kernelcache.exercise.vllm_moe:moe"
    about = About(
        "the fused-MoE layer (TritonExperts) for every token count up to max_num_batched_tokens",
        ("vllm.model_executor.layers.fused_moe.fused_moe", "vLLM's fused-MoE Triton kernels"),
        reads=("model.num_experts", "model.hidden_size", "model.moe_intermediate_size", "model.num_experts_per_tok",
               "model.dtype", "dtypes", "max_num_batched_tokens", "tensor_parallel_size"),
        note="needs a MoE model", probe="tests/probes/moe_keys.py", gpu_check="moe", proven="H200", contacts=CONTACTS)
    unit = MODEL
    keys_follow_device = True
    model = ModelRole(owned=True, rank=1)

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        model = plan.model
        if model is None or not model.is_moe:
            return ()
        return tuple(self.task({
            "num_experts": model.num_experts, "hidden_size": model.hidden_size,
            "intermediate_size": model.moe_intermediate_size, "top_k": model.num_experts_per_tok, "dtype": dtype,
            "max_num_batched_tokens": plan.max_num_batched_tokens,
            "tensor_parallel_size": plan.tensor_parallel_size}) for dtype in plan.layer_dtypes)

    def check(self, plan, where: str) -> None:
        model = plan.model
        if model is None or not model.is_moe:
            what = "no model" if model is None else f"the dense model {model.name}"
            raise RecipeError(f"{where}: the moe path needs a mixture-of-experts model ([model] or --model-config), "
                              f"the plan has {what}")
        if model.moe_intermediate_size % plan.tensor_parallel_size:
            raise RecipeError(f"{where}: tensor_parallel_size {plan.tensor_parallel_size} does not divide "
                              f"{model.name}'s expert width {model.moe_intermediate_size}")

    def default(self, plan) -> bool:
        return bool(plan.model and plan.model.is_moe)

    def from_model(self, model, plan) -> bool:
        return model.is_moe


FAMILY = Moe()
