"""A hybrid model's gated-delta-net layers (exercise/vllm_gdn.py): ``QwenGatedDeltaNetAttention`` over the
profile run, decode, prefill and mixed batches, once per dtype they run in, every FLA autotune candidate.

Gated-delta-net models (the ``gdn`` path) are the architectures whose vLLM 0.33 model file builds
``QwenGatedDeltaNetAttention`` from the ``linear_*`` fields (``GDN_ARCHITECTURES``): Qwen3-Next (its fused,
GQA-interleaved projections) and Qwen3.5 (dense and MoE, text-only and multimodal). Their SSM state's dtype is
``mamba_ssm_cache_dtype`` where the config has one, else Qwen3.5's ``mamba_ssm_dtype``
(``Qwen3_5ForConditionalGenerationConfig`` applies it), else ``auto``. Architectures whose linear-attention layers
are other classes (``GDN_REFUSED``: Kimi's KDA, OLMo's hybrid, Bailing's, and the multimodal wrappers kernelcache has
not checked) are refused, rather than built without those layers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...errors import RecipeError
from ..config import integer
from ..family import MODEL, About, Family, Flag, ModelRole, ModelSection, Task
from ..releases import stable
from .mamba import SSM_CACHE_DTYPES

# The gated-delta-net layer, its metadata builder and the attention spec beside it (exercise/vllm_gdn.py; the
# distributed set-up is the mamba family's).
CONTACTS = stable(
    "vllm._custom_ops", "vllm.config:CUDAGraphMode", "vllm.config:VllmConfig", "vllm.config:set_current_vllm_config",
    "vllm.forward_context:set_forward_context",
    "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn:QwenGatedDeltaNetAttention",
    "vllm.model_executor.layers.mamba.gdn:qwen_gdn_linear_attn", "vllm.platforms:current_platform",
    "vllm.utils.math_utils:cdiv", "vllm.utils.torch_utils:STR_DTYPE_TO_TORCH_DTYPE",
    "vllm.utils.torch_utils:set_default_torch_dtype", "vllm.v1.attention.backend:CommonAttentionMetadata",
    "vllm.v1.attention.backend:MultipleOf", "vllm.v1.attention.backends.gdn_attn:GDNAttentionMetadataBuilder",
    "vllm.v1.attention.backends.registry:AttentionBackendEnum", "vllm.v1.kv_cache_interface:FullAttentionSpec",
    "vllm.v1.kv_cache_interface:get_kv_quant_mode")

# Per architecture: how vLLM 0.33's model file builds QwenGatedDeltaNetAttention (gqa_interleaved_layout).
GDN_ARCHITECTURES = {"Qwen3NextForCausalLM": "interleaved",  # models/qwen3_next.py
                     "Qwen3_5ForCausalLM": "flat", "Qwen3_5MoeForCausalLM": "flat",  # models/qwen3_5.py
                     "Qwen3_5ForConditionalGeneration": "flat", "Qwen3_5MoeForConditionalGeneration": "flat"}
_GDN_SSM_DTYPE_FIELD = {a: "mamba_ssm_dtype" for a in GDN_ARCHITECTURES if a.startswith("Qwen3_5")}
GDN_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
              "linear_conv_kernel_dim")
# Architectures vLLM 0.33 builds linear-attention (GDN / KDA) layers for that the gdn path does not drive.
GDN_REFUSED = {
    "KimiLinearForCausalLM": "KDA layers (ops/kda.py)", "AliceAIForCausalLM": "KimiGatedDeltaNetAttention (KDA)",
    "BailingMoeV3ForCausalLM": "BailingMoeV3KimiDeltaAttention (KDA)",
    "BailingMoeV3VLForConditionalGeneration": "BailingMoeV3KimiDeltaAttention (KDA)",
    "OlmoHybridForCausalLM": "OlmoHybridGatedDeltaNetAttention",
    "InternS2MobiusForConditionalGeneration": "QwenGatedDeltaNetAttention inside a multimodal wrapper whose config "
                                              "kernelcache has not checked",
    "MiniCPMV4_6ForConditionalGeneration": "QwenGatedDeltaNetAttention inside a multimodal wrapper whose config "
                                           "kernelcache has not checked",
    "Qwen4ExpForCausalLM": "several linear-attention state layouts", "Qwen4ExpForConditionalGeneration":
        "several linear-attention state layouts"}


@dataclass(frozen=True)
class GdnSpec:
    """A gated-delta-net layer's dimensions under the config.json names (exercise/vllm_gdn.py's task)."""

    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    layout: str  # "interleaved" (Qwen3-Next's fused projections) or "flat" (Qwen3.5)
    mamba_ssm_cache_dtype: str = "auto"


def parse(fields: dict, architecture: str, where: str) -> GdnSpec | None:
    """The gated-delta-net layers of an architecture ``GDN_ARCHITECTURES`` knows (None for one without them)."""
    if architecture in GDN_REFUSED:
        raise RecipeError(f"{where}: {architecture} has linear-attention layers kernelcache does not build "
                          f"({GDN_REFUSED[architecture]}); the gdn path builds "
                          f"{', '.join(sorted(GDN_ARCHITECTURES))}")
    layout = GDN_ARCHITECTURES.get(architecture)
    if layout is None:
        return None
    field = "mamba_ssm_cache_dtype" if fields.get("mamba_ssm_cache_dtype") else _GDN_SSM_DTYPE_FIELD.get(architecture)
    dtype = (fields.get(field) if field else None) or "auto"
    if dtype not in SSM_CACHE_DTYPES:
        raise RecipeError(f"{where}: '{field}' must be one of {', '.join(SSM_CACHE_DTYPES)}, got {dtype!r}")
    return GdnSpec(**{name: integer(fields, name, where) for name in GDN_FIELDS}, layout=layout,
                   mamba_ssm_cache_dtype=dtype)


SECTION = ModelSection("gdn", GdnSpec, parse, frozenset({*GDN_FIELDS, "mamba_ssm_cache_dtype", "mamba_ssm_dtype"}))

# vLLM's --gdn-prefill-backend for NVIDIA GPUs; auto: vLLM's choice (FlashInfer's GDN prefill on Hopper, and on
# Blackwell with 128-dim keys and CUDA 13; the FLA Triton kernels otherwise: _resolve_gdn_prefill_backend).
GDN_PREFILL_BACKENDS = ("auto", "triton", "flashinfer")
PREFILL_BACKEND = Flag("--gdn-prefill-backend", GDN_PREFILL_BACKENDS, "vLLM --gdn-prefill-backend (gdn): auto (vLLM's "
                       "choice: FlashInfer's CUDA module on Hopper), triton (the FLA Triton kernels), flashinfer.")


class Gdn(Family):
    name = "gdn"
    exercise = "kernelcache.exercise.vllm_gdn:gdn"
    about = About(
        "a hybrid model's gated-delta-net layers (QwenGatedDeltaNetAttention), every FLA autotune candidate",
        ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "vLLM's gated-delta-net layer"),
        reads=("model.gdn", "model.hidden_size", "model.num_key_value_heads", "model.head_dim", "model.dtype",
               "dtypes", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size", "num_speculative_tokens",
               "gdn_prefill_backend", "attention_backend", "kv_cache_dtype", "block_size", "max_model_len"),
        note="needs a gated-delta-net model: Qwen3-Next, Qwen3.5", probe="tests/probes/gdn_keys.py", gpu_check="gdn",
        proven="H100", contacts=CONTACTS)
    unit = MODEL
    flags = (PREFILL_BACKEND,)
    model = ModelRole(SECTION, owned=True, rank=3)

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        """Once per dtype the layers run in, with the serving settings their kernels depend on: drafts, the prefill
        backend, and the attention layers' page, which the GDN state's page is padded to (its block stride is a
        constexpr of the decode kernels)."""
        model = plan.model
        layers = model.section("gdn") if model else None
        if layers is None:
            return ()
        return tuple(self.task({
            **asdict(layers), "hidden_size": model.hidden_size, "dtype": dtype, "max_num_seqs": plan.max_num_seqs,
            "max_num_batched_tokens": plan.max_num_batched_tokens, "tensor_parallel_size": plan.tensor_parallel_size,
            "num_speculative_tokens": plan.num_speculative_tokens,
            "gdn_prefill_backend": plan.flag(PREFILL_BACKEND.name),
            "num_key_value_heads": model.num_key_value_heads, "head_dim": model.head_dim,
            "attention_backend": plan.attention_backend, "kv_cache_dtype": plan.kv_cache_dtype,
            "block_size": plan.block_size, "max_model_len": plan.max_model_len})
            for dtype in plan.layer_dtypes)

    def check(self, plan, where: str) -> None:
        model = plan.model
        layers = model.section("gdn") if model else None
        if layers is None:
            what = "no model" if model is None else f"{model.name} ({model.architecture}), which has none"
            raise RecipeError(f"{where}: the gdn path needs a model with gated-delta-net layers (architectures: "
                              f"{', '.join(GDN_ARCHITECTURES)}), the plan has {what}")
        heads = (layers.linear_num_key_heads, layers.linear_num_value_heads)
        if any(h % plan.tensor_parallel_size for h in heads):
            raise RecipeError(f"{where}: tensor_parallel_size {plan.tensor_parallel_size} does not divide "
                              f"{model.name}'s {heads[0]} key / {heads[1]} value heads of its gated-delta-net layers")

    def from_model(self, model, plan) -> bool:
        return model.section("gdn") is not None

    def default(self, plan) -> bool:
        return bool(plan.model and self.from_model(plan.model, plan))


FAMILY = Gdn()
