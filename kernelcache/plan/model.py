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

A family's own layers (a hybrid model's Mamba-2 or gated-delta-net layers) are read by the family's declaration
(plan/families/: ``Family.model.section``): ``ModelSpec.section(key)`` holds them, and plans record each under its
key.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from ..errors import RecipeError
from . import families
from .config import integer as _int

MODEL_DTYPES = ("bfloat16", "float16", "float32")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
# What a recipe's [model] table may hold besides the families' own layers' fields (recipe_keys()); a config.json
# holds much more, which is ignored.
_COMMON_KEYS = {"name", "architectures", "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                "num_experts_per_tok", "num_attention_heads", "num_key_value_heads", "head_dim",
                "max_position_embeddings", "torch_dtype", "dtype", "sliding_window", "use_sliding_window",
                "layer_types", "attn_logit_softcapping", *_EXPERT_KEYS}


def sections() -> tuple:
    """The families' model sections (``ModelRole.section``), in path order: mamba, gdn, then any registered."""
    return tuple(f.model.section for f in families.families() if f.model.section)


def recipe_keys() -> set[str]:
    """What a recipe's [model] table may hold: the common fields and every family's own."""
    return _COMMON_KEYS.union(*(s.config_keys for s in sections()))


RECIPE_KEYS = recipe_keys()  # the built-in families'; recipe_keys() also has any registered since


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
    layers: tuple[tuple[str, Any], ...] = ()  # (section key, spec) of the families' own layers it has

    def section(self, key: str) -> Any:
        """A family's layers of this model (``ModelSection.key``: mamba, gdn, ...); None when it has none."""
        return dict(self.layers).get(key)

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
        """The common fields, then one key per family section (None where the model has no such layers)."""
        data = {f.name: getattr(self, f.name) for f in dataclass_fields(self) if f.name != "layers"}
        specs = dict(self.layers)
        return {**data, **{s.key: asdict(specs[s.key]) if s.key in specs else None for s in sections()}}

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        keys = {s.key: s for s in sections()}
        common = {k: v for k, v in data.items() if k not in keys}
        return cls(**common, layers=tuple((k, keys[k].spec(**data[k])) for k in keys if data.get(k)))


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
        layers=_layers(fields, architectures[0], where),
    )


def _layers(fields: dict, architecture: str, where: str) -> tuple[tuple[str, Any], ...]:
    """Each family section's layers the architecture has, in path order."""
    found = ((s.key, s.parse(fields, architecture, where)) for s in sections())
    return tuple((key, spec) for key, spec in found if spec is not None)


def _soft_cap(fields: dict, where: str) -> float:
    """``attn_logit_softcapping`` (Gemma 2 passes it to ``Attention`` as ``logits_soft_cap``); null or absent: 0."""
    value = fields.get("attn_logit_softcapping")
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise RecipeError(f"{where}: model field 'attn_logit_softcapping' must be a non-negative number, got {value!r}")
    return float(value)


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
