"""A hybrid model's Mamba-2 layers (exercise/vllm_mamba.py): ``MambaMixer2`` over the engine's profile run,
decode, prefill and mixed batches, once per dtype the layers run in, every autotune candidate of the SSD
kernels compiled.

Hybrid models' Mamba-2 layers (the ``mamba`` path) take their dimensions from names that differ per
architecture (``MAMBA_CONFIG_NAMES``: what each vLLM 0.33 model file passes to ``MambaMixer2``). The SSM
state's dtype is the config's ``mamba_ssm_cache_dtype`` where it has one; otherwise ``auto`` (the model's
dtype), except Nemotron-H, whose vLLM config class turns ``auto`` into float32
(vllm/model_executor/models/config.py, ``NemotronHForCausalLMConfig``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...errors import RecipeError
from ..config import integer
from ..family import MODEL, About, Family, ModelRole, ModelSection, Task
from ..releases import stable

# MambaMixer2, its metadata builder and the SSU dispatch (exercise/vllm_mamba.py).
CONTACTS = stable(
    "vllm._custom_ops", "vllm.config:VllmConfig", "vllm.config:set_current_vllm_config",
    "vllm.distributed.parallel_state:model_parallel_is_initialized", "vllm.distributed:init_distributed_environment",
    "vllm.distributed:initialize_model_parallel", "vllm.forward_context:set_forward_context",
    "vllm.model_executor.layers.mamba.mamba_mixer2:MambaMixer2",
    "vllm.model_executor.layers.mamba.ops.ssu_dispatch:get_mamba_ssu_backend",
    "vllm.model_executor.layers.mamba.ops.ssu_dispatch:initialize_mamba_ssu_backend",
    "vllm.model_executor.layers.mamba.ops:mamba_ssm", "vllm.platforms:current_platform",
    "vllm.utils.torch_utils:set_default_torch_dtype", "vllm.v1.attention.backend:CommonAttentionMetadata",
    "vllm.v1.attention.backends.mamba2_attn:Mamba2AttentionMetadataBuilder",
    "vllm.v1.kv_cache_interface:KVCacheConfig", "vllm.v1.kv_cache_interface:KVCacheGroupSpec")

SSM_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")  # vLLM --mamba-ssm-cache-dtype
# Per architecture: MambaMixer2's argument -> the config.json field vLLM 0.33's model file reads for it.
_NEMOTRON_H = {"mamba_num_heads": "mamba_num_heads", "mamba_head_dim": "mamba_head_dim",
               "ssm_state_size": "ssm_state_size", "n_groups": "n_groups", "conv_kernel": "conv_kernel",
               "chunk_size": "chunk_size"}  # models/nemotron_h.py (NemotronHMambaDecoderLayer)
_GRANITE_FALCON = {"mamba_num_heads": "mamba_n_heads", "mamba_head_dim": "mamba_d_head",
                   "ssm_state_size": "mamba_d_state", "n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv",
                   "chunk_size": "mamba_chunk_size"}  # models/granitemoehybrid.py, models/falcon_h1.py
MAMBA_CONFIG_NAMES = {
    "NemotronHForCausalLM": _NEMOTRON_H,
    "GraniteMoeHybridForCausalLM": _GRANITE_FALCON,
    "FalconH1ForCausalLM": _GRANITE_FALCON,
    "Mamba2ForCausalLM": {"mamba_num_heads": "num_heads", "mamba_head_dim": "head_dim",  # models/mamba2.py
                          "ssm_state_size": "state_size", "n_groups": "n_groups", "conv_kernel": "conv_kernel",
                          "chunk_size": "chunk_size"},
}
_SSM_CACHE_DEFAULT = {"NemotronHForCausalLM": "float32"}


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba-2 layer's dimensions, under MambaMixer2's argument names (exercise/vllm_mamba.py's task)."""

    mamba_num_heads: int
    mamba_head_dim: int
    ssm_state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    mamba_ssm_cache_dtype: str = "auto"


def parse(fields: dict, architecture: str, where: str) -> MambaSpec | None:
    """The Mamba-2 layers of an architecture ``MAMBA_CONFIG_NAMES`` knows (None for any other)."""
    names = MAMBA_CONFIG_NAMES.get(architecture)
    if names is None:
        return None
    dtype = fields.get("mamba_ssm_cache_dtype") or _SSM_CACHE_DEFAULT.get(architecture, "auto")
    if dtype not in SSM_CACHE_DTYPES:
        raise RecipeError(f"{where}: 'mamba_ssm_cache_dtype' must be one of {', '.join(SSM_CACHE_DTYPES)}, "
                          f"got {dtype!r}")
    return MambaSpec(**{arg: integer(fields, name, where) for arg, name in names.items()},
                     mamba_ssm_cache_dtype=dtype)


SECTION = ModelSection("mamba", MambaSpec, parse, frozenset(
    {"mamba_ssm_cache_dtype", *(name for names in MAMBA_CONFIG_NAMES.values() for name in names.values())}))


class Mamba(Family):
    name = "mamba"
    exercise = "kernelcache.exercise.vllm_mamba:mamba"
    about = About(
        "a hybrid model's Mamba-2 layers (MambaMixer2), every SSD autotune candidate",
        ("vllm.model_executor.layers.mamba.mamba_mixer2", "vLLM's Mamba-2 mixer"),
        reads=("model.mamba", "model.hidden_size", "model.dtype", "dtypes", "max_num_seqs", "max_num_batched_tokens",
               "tensor_parallel_size"),
        note="needs a hybrid model", probe="tests/probes/mamba_keys.py", gpu_check="mamba", proven="H200",
        contacts=CONTACTS)
    unit = MODEL
    keys_follow_device = True
    model = ModelRole(SECTION, owned=True, rank=2)

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        model = plan.model
        layers = model.section("mamba") if model else None
        if layers is None:
            return ()
        return tuple(self.task({
            **asdict(layers), "hidden_size": model.hidden_size, "dtype": dtype, "max_num_seqs": plan.max_num_seqs,
            "max_num_batched_tokens": plan.max_num_batched_tokens, "tensor_parallel_size": plan.tensor_parallel_size})
            for dtype in plan.layer_dtypes)

    def check(self, plan, where: str) -> None:
        model = plan.model
        layers = model.section("mamba") if model else None
        if layers is None:
            what = "no model" if model is None else f"{model.name} ({model.architecture}), which has none"
            raise RecipeError(f"{where}: the mamba path needs a hybrid model with Mamba-2 layers (architectures: "
                              f"{', '.join(MAMBA_CONFIG_NAMES)}), the plan has {what}")
        if layers.mamba_num_heads % plan.tensor_parallel_size:
            raise RecipeError(f"{where}: tensor_parallel_size {plan.tensor_parallel_size} does not divide "
                              f"{model.name}'s {layers.mamba_num_heads} Mamba heads")

    def from_model(self, model, plan) -> bool:
        return model.section("mamba") is not None

    def default(self, plan) -> bool:
        return bool(plan.model and self.from_model(plan.model, plan))


FAMILY = Mamba()
