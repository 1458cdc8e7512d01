"""vLLM's Triton attention backend (exercise/vllm_attention.py): the ``TRITON_ATTN`` layer and metadata builder
over capture, decode, prefill and mixed batches, once per sliding window of the model's layers."""

from __future__ import annotations

from ...errors import RecipeError
from ..family import MODEL, About, Family, ModelRole, Task
from ..releases import Contact, stable

# The TRITON_ATTN layer, its metadata builder and the KV-cache views (exercise/vllm_attention.py); the block-table
# width is the runner family's contact (plan/families/runner.py).
CONTACTS = (
    # The model loader's process_weights_after_loading: 0.33 passed the model dtype; from 0.34 the layer keeps
    # torch's default dtype at construction (act_dtype) and the method takes none.
    Contact("process_weights_after_loading",
            "vllm.model_executor.layers.attention:Attention.process_weights_after_loading", ("0.33",),
            params=("self", "act_dtype")),
    Contact("process_weights_after_loading",
            "vllm.model_executor.layers.attention:Attention.process_weights_after_loading", ("0.34",),
            params=("self",)),
) + stable(
    "vllm.config:CUDAGraphMode", "vllm.config:CacheConfig", "vllm.config:CompilationConfig",
    "vllm.config:SchedulerConfig", "vllm.config:VllmConfig", "vllm.config:set_current_vllm_config",
    "vllm.forward_context:set_forward_context", "vllm.model_executor.layers.attention:Attention",
    "vllm.triton_utils:triton", "vllm.utils.math_utils:cdiv", "vllm.utils.torch_utils:set_default_torch_dtype",
    "vllm.v1.attention.backend:CommonAttentionMetadata",
    "vllm.v1.attention.backends.triton_attn:TritonAttentionBackend",
    "vllm.v1.attention.backends.utils:get_supported_kv_cache_layouts",
    "vllm.v1.attention.backends.utils:resolve_kv_cache_layout", "vllm.v1.kv_cache_interface:KVCacheTensor",
    "vllm.v1.kv_cache_interface:compute_layout_strides", "vllm.v1.kv_cache_interface:create_kv_cache_views")

# vLLM's --attention-backend names that matter here: the attention path builds TRITON_ATTN's kernels; the
# others are CUDA/C++ (FlashAttention, FlashInfer) and compile no Triton kernel. auto: vLLM's choice, which
# on NVIDIA GPUs puts FLASH_ATTN (Hopper and older) or FLASHINFER (Blackwell) before TRITON_ATTN
# (vllm/platforms/cuda.py, _get_backend_priorities).
ATTENTION_BACKENDS = ("auto", "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
TRITON_ATTN = "TRITON_ATTN"
# vLLM's --kv-cache-dtype; auto: the model's dtype. The attention path builds only auto today (an fp8 KV cache
# needs the cache-write and attention kernels' fp8 variants, which the exercise does not drive yet).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def check_heads(plan, path: str, where: str) -> None:
    """An attention path needs a model whose attention heads the tensor-parallel size divides."""
    model = plan.model
    if model is None or not model.num_attention_heads:
        raise RecipeError(f"{where}: the {path} path needs a model with num_attention_heads ([model] or "
                          "--model-config)")
    if model.num_attention_heads % plan.tensor_parallel_size:
        raise RecipeError(f"{where}: tensor_parallel_size {plan.tensor_parallel_size} does not divide "
                          f"{model.name}'s {model.num_attention_heads} attention heads")


def window_tasks(plan, flashinfer: bool = False) -> tuple[dict, ...]:
    """Each attention task's arguments, one per sliding window of the model's layers (0: full attention): the
    model's heads and the plan's serving limits; with ``flashinfer`` also what the FlashInfer backend reads (the
    logits soft-cap, the backend named, whether cubins are reachable). Both attention families plan with this. The
    order is the exercise functions' parameter order (exercise/vllm_attention.py ``attention``,
    exercise/vllm_flashinfer.py ``flashinfer_attention``) and part of the task's JSON: keep it."""
    model = plan.model
    if model is None:
        return ()
    out = []
    for window in model.attention_windows:
        kwargs = {"num_heads": model.num_attention_heads, "num_kv_heads": model.num_key_value_heads,
                  "head_size": model.head_dim, "dtype": model.dtype, "kv_cache_dtype": plan.kv_cache_dtype,
                  "block_size": plan.block_size, "max_num_seqs": plan.max_num_seqs,
                  "max_model_len": plan.max_model_len, "max_num_batched_tokens": plan.max_num_batched_tokens,
                  "sliding_window": window}
        if flashinfer:
            kwargs["logits_soft_cap"] = model.logits_soft_cap
        kwargs["tensor_parallel_size"] = plan.tensor_parallel_size
        if flashinfer:
            kwargs |= {"attention_backend": plan.attention_backend, "cubins": plan.flashinfer_cubins}
        out.append(kwargs)
    return tuple(out)


def served(plan) -> bool:
    """Whether the plan serves with the Triton attention backend (a model recipe then builds the path)."""
    return plan.attention_backend == TRITON_ATTN


class Attention(Family):
    name = "attention"
    exercise = "kernelcache.exercise.vllm_attention:attention"
    about = About(
        "vLLM's Triton attention backend (TRITON_ATTN), once per sliding window",
        ("vllm.v1.attention.backends.triton_attn", "vLLM's Triton attention backend"),
        reads=("model.num_attention_heads", "model.num_key_value_heads", "model.head_dim", "model.dtype",
               "model.sliding_window", "model.full_attention_layers", "kv_cache_dtype", "block_size", "max_num_seqs",
               "max_model_len", "max_num_batched_tokens", "tensor_parallel_size"),
        note="needs --attention-backend TRITON_ATTN", probe="tests/probes/attention_keys.py", gpu_check="attention",
        proven="H200", contacts=CONTACTS)
    unit = MODEL
    model = ModelRole(rank=4)

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        return tuple(self.task(kwargs) for kwargs in window_tasks(plan))

    def check(self, plan, where: str) -> None:
        if plan.attention_backend != TRITON_ATTN:
            raise RecipeError(f"{where}: the attention path builds vLLM's Triton attention backend; it needs "
                              f"attention_backend = TRITON_ATTN (--attention-backend), the plan has "
                              f"{plan.attention_backend}")
        if plan.kv_cache_dtype != "auto":
            raise RecipeError(f"{where}: the attention path builds kv_cache_dtype auto only (the model's dtype); "
                              f"an {plan.kv_cache_dtype} KV cache's Triton kernels are not exercised yet")
        check_heads(plan, "attention", where)

    def default(self, plan) -> bool:
        return plan.model is not None and served(plan)

    def from_model(self, model, plan) -> bool:
        return served(plan)


FAMILY = Attention()
