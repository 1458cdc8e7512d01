"""A model, as far as its Triton kernels care: the fields of a Hugging Face ``config.json`` a build reads.

``kernelcache build --model-config PATH/config.json`` (a local file; nothing is fetched) and a recipe's
``[model]`` table (the same field names, so a recipe can be a config.json's relevant lines) both give a
``ModelSpec``. It decides the vocab size (the sampler, runner and spec-decode paths), for
mixture-of-experts models the fused-MoE kernels' dimensions (``moe``), the attention layers' heads and
windows (``attention``), a hybrid model's Mamba-2 layers (``mamba``) and its gated-delta-net layers (``gdn``).

Field names differ between model families (Hugging Face transformers' configuration classes):
experts are ``num_experts`` (Qwen2/Qwen3 MoE), ``num_local_experts`` (Mixtral) or ``n_routed_experts``
(DeepSeek-V2/V3); each expert's FFN width is ``moe_intermediate_size`` (Qwen, DeepSeek) or, for
Mixtral, ``intermediate_size``; the dtype is ``torch_dtype`` (``dtype`` since transformers 4.56). A
multimodal config holds the language model's fields in ``text_config``. ``num_key_value_heads`` defaults
to ``num_attention_heads`` and ``head_dim`` to ``hidden_size // num_attention_heads`` (transformers'
LlamaConfig). ``sliding_window`` counts only where the model uses it: Qwen2/Qwen3 configs carry a window
with ``use_sliding_window: false``; models whose ``layer_types`` mix ``sliding_attention`` and
``full_attention`` (Gemma 2/3, gpt-oss) have layers of both kinds.

Hybrid models' Mamba-2 layers (the ``mamba`` path) take their dimensions from names that differ per
architecture (``MAMBA_CONFIG_NAMES``: what each vLLM 0.33 model file passes to ``MambaMixer2``). The SSM
state's dtype is the config's ``mamba_ssm_cache_dtype`` where it has one; otherwise ``auto`` (the model's
dtype), except Nemotron-H, whose vLLM config class turns ``auto`` into float32
(vllm/model_executor/models/config.py, ``NemotronHForCausalLMConfig``).

Gated-delta-net models (the ``gdn`` path) are the architectures whose vLLM 0.33 model file builds
``QwenGatedDeltaNetAttention`` from the ``linear_*`` fields (``GDN_ARCHITECTURES``): Qwen3-Next (its fused,
GQA-interleaved projections) and Qwen3.5 (dense and MoE, text-only and multimodal). Their SSM state's dtype is
``mamba_ssm_cache_dtype`` where the config has one, else Qwen3.5's ``mamba_ssm_dtype``
(``Qwen3_5ForConditionalGenerationConfig`` applies it), else ``auto``. Architectures whose linear-attention layers
are other classes (``GDN_REFUSED``: Kimi's KDA, OLMo's hybrid, Bailing's, and the multimodal wrappers kernelcache has
not checked) are refused, rather than built without those layers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import RecipeError

MODEL_DTYPES = ("bfloat16", "float16", "float32")
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
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
# What a recipe's [model] table may hold (a config.json holds much more, which is ignored).
RECIPE_KEYS = {"name", "architectures", "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
               "num_experts_per_tok", "num_attention_heads", "num_key_value_heads", "head_dim",
               "max_position_embeddings", "torch_dtype", "dtype", "sliding_window", "use_sliding_window",
               "layer_types", "mamba_ssm_cache_dtype", "mamba_ssm_dtype", "attn_logit_softcapping", *_EXPERT_KEYS,
               *GDN_FIELDS,
               *{name for names in MAMBA_CONFIG_NAMES.values() for name in names.values()}}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    vocab_size: int
    hidden_size: int
    dtype: str  # the checkpoint's dtype, what vLLM's --dtype auto serves
    num_experts: int = 0  # 0: a dense model
    moe_intermediate_size: int = 0  # one expert's FFN width, before tensor-parallel sharding
    num_experts_per_tok: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    max_position_embeddings: int = 0
    sliding_window: int = 0  # 0: every attention layer sees the whole context
    full_attention_layers: bool = True  # whether some layers attend to everything (with a window: mixed)
    logits_soft_cap: float = 0.0  # attn_logit_softcapping (Gemma 2): tanh soft-capping of attention logits
    mamba: MambaSpec | None = None  # a hybrid model's Mamba-2 layers
    gdn: GdnSpec | None = None  # a hybrid model's gated-delta-net layers

    @property
    def is_hybrid(self) -> bool:
        return self.mamba is not None

    @property
    def is_gdn(self) -> bool:
        return self.gdn is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_windows(self) -> tuple[int, ...]:
        """The distinct sliding windows of the attention layers (0: none)."""
        if not self.sliding_window:
            return (0,)
        return (0, self.sliding_window) if self.full_attention_layers else (self.sliding_window,)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        mamba, gdn = data.get("mamba"), data.get("gdn")
        return cls(**{**data, "mamba": MambaSpec(**mamba) if mamba else None, "gdn": GdnSpec(**gdn) if gdn else None})


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


def load_config(path: str | Path) -> ModelSpec:
    """A local Hugging Face ``config.json`` -> ``ModelSpec`` (its folder names the model)."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"{file}: no such model config") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"{file}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise RecipeError(f"{file}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{file}: a model config must be a JSON object")
    name = file.parent.name if file.stem == "config" and file.parent.name else file.stem
    return parse(data, str(file), name)


def parse(data: dict, where: str, name: str = "") -> ModelSpec:
    """The fields kernelcache reads, checked; an error names the file and the field."""
    fields = {**data, **data["text_config"]} if isinstance(data.get("text_config"), dict) else data
    architectures = fields.get("architectures") or data.get("architectures") or ["?"]
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise RecipeError(f"{where}: 'architectures' must be a list of class names")
    experts = _experts(fields, where)
    heads = _int(fields, "num_attention_heads", where, 0)
    window, full_layers = _window(fields, where)
    return ModelSpec(
        name=str(fields.get("name") or name or architectures[0]),
        architecture=architectures[0],
        vocab_size=_int(fields, "vocab_size", where),
        hidden_size=_int(fields, "hidden_size", where),
        dtype=_dtype(fields, where),
        num_experts=experts,
        moe_intermediate_size=_moe_width(fields, experts, where),
        num_experts_per_tok=_int(fields, "num_experts_per_tok", where) if experts else 0,
        num_attention_heads=heads,
        num_key_value_heads=_int(fields, "num_key_value_heads", where, heads),
        head_dim=_int(fields, "head_dim", where, _int(fields, "hidden_size", where) // heads if heads else 0),
        max_position_embeddings=_int(fields, "max_position_embeddings", where, 0),
        sliding_window=window,
        full_attention_layers=full_layers,
        logits_soft_cap=_soft_cap(fields, where),
        mamba=_mamba(fields, architectures[0], where),
        gdn=_gdn(fields, architectures[0], where),
    )


def _mamba(fields: dict, architecture: str, where: str) -> MambaSpec | None:
    """The Mamba-2 layers of an architecture ``MAMBA_CONFIG_NAMES`` knows (None for any other)."""
    names = MAMBA_CONFIG_NAMES.get(architecture)
    if names is None:
        return None
    dtype = fields.get("mamba_ssm_cache_dtype") or _SSM_CACHE_DEFAULT.get(architecture, "auto")
    if dtype not in SSM_CACHE_DTYPES:
        raise RecipeError(f"{where}: 'mamba_ssm_cache_dtype' must be one of {', '.join(SSM_CACHE_DTYPES)}, "
                          f"got {dtype!r}")
    return MambaSpec(**{arg: _int(fields, name, where) for arg, name in names.items()},
                     mamba_ssm_cache_dtype=dtype)


def _gdn(fields: dict, architecture: str, where: str) -> GdnSpec | None:
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
    return GdnSpec(**{name: _int(fields, name, where) for name in GDN_FIELDS}, layout=layout,
                   mamba_ssm_cache_dtype=dtype)


def _window(fields: dict, where: str) -> tuple[int, bool]:
    """(the sliding window in use or 0, whether some layers attend to everything)."""
    if fields.get("sliding_window") is None or fields.get("use_sliding_window") is False:
        return 0, True
    window = _int(fields, "sliding_window", where)
    kinds = fields.get("layer_types")
    if kinds is None:
        return window, False
    if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
        raise RecipeError(f"{where}: 'layer_types' must be a list of strings")
    if "sliding_attention" not in kinds:
        return 0, True
    return window, "full_attention" in kinds


def _soft_cap(fields: dict, where: str) -> float:
    """``attn_logit_softcapping`` (Gemma 2 passes it to ``Attention`` as ``logits_soft_cap``); null or absent: 0."""
    value = fields.get("attn_logit_softcapping")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise RecipeError(f"{where}: model field 'attn_logit_softcapping' must be a non-negative number, got {value!r}")
    return float(value)


def _experts(fields: dict, where: str) -> int:
    for key in _EXPERT_KEYS:
        if fields.get(key) is not None:
            return _int(fields, key, where)
    return 0


def _moe_width(fields: dict, experts: int, where: str) -> int:
    if not experts:
        return 0
    key = "moe_intermediate_size" if "moe_intermediate_size" in fields else "intermediate_size"
    return _int(fields, key, where)


def _dtype(fields: dict, where: str) -> str:
    value = fields.get("torch_dtype", fields.get("dtype", "bfloat16"))
    if value not in MODEL_DTYPES:
        raise RecipeError(f"{where}: model dtype {value!r} is not one of {', '.join(MODEL_DTYPES)}")
    return value


def _int(fields: dict, key: str, where: str, default: int | None = None) -> int:
    value: Any = fields.get(key)
    value = default if value is None else value  # a config's null means "the default" (Mistral's head_dim)
    if value is None:
        raise RecipeError(f"{where}: the model config has no '{key}'")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and default is None):
        raise RecipeError(f"{where}: model field '{key}' must be a positive integer, got {value!r}")
    return value
