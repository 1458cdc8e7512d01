"""Build recipes (TOML) -> a frozen, validated ``BuildPlan``.

A recipe says which vLLM sampler paths to exercise (and speculative decoding's, with drafts), for which
vocab sizes, logits dtypes, batch range and sampling modes, and for which GPU profiles; a model recipe
adds a ``[model]`` table, the fields of the model's Hugging Face config.json (plan/model.py) that decide its
vocab and its layers' kernels (MoE, attention, Mamba, gated delta net). Every key is checked; an error names
the file and the key. ``PlanOverrides`` (the flags ``build`` and ``verify`` share) override the file.

The package ships its recipes as package data (``kernelcache/recipes/*.toml``, model recipes in
``kernelcache/recipes/models/``), found beside this package wherever it is installed, never in a checkout.
``--recipe`` takes a shipped recipe's name (its file's stem: ``qwen3-30b-a3b``) or a TOML file's path; a plain
word (no directory, no ``.toml``) names a shipped recipe first. A shipped recipe's plan records its file
relative to the package (``kernelcache/recipes/vllm-sampler.toml``), so a bundle does not name the install
location. ("Manifest" only ever means a bundle's manifest.json.)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import RecipeError, UsageError
from ..format.manifest import arch_to_capability, capability_to_arch
from ..usercache import user_cache
from . import families
from .families.attention import ATTENTION_BACKENDS, KV_CACHE_DTYPES, TRITON_ATTN
from .families.flashinfer_attention import FLASHINFER
from .gpus import PROFILES, GpuProfile
from .model import ModelSpec, load_config, recipe_keys
from .model import parse as parse_model
from .serve import SHORTHAND, ServeCommand, ServeConfig, shorthand_words

PATHS = families.names()  # the built-in paths; families.names() also has any registered since
__all__ = ["ATTENTION_BACKENDS", "KV_CACHE_DTYPES", "PATHS", "TRITON_ATTN", "BuildPlan",
           "PlanOverrides", "Vocab", "load", "parse", "resolve", "shipped"]
MODES = ("top_k", "top_p", "top_k_top_p")
DTYPES = ("float32", "bfloat16", "float16")
RECIPES = Path(__file__).resolve().parents[1] / "recipes"  # the shipped recipes: kernelcache/recipes/
DEFAULT_RECIPE = "vllm-sampler"


@dataclass(frozen=True)
class Vocab:
    size: int
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanOverrides:
    """What ``build`` and ``verify`` flags change in a recipe's plan; an empty or None field keeps the file's."""

    gpus: tuple[str, ...] | None = None  # GPU profile names (--gpu)
    vocabs: tuple[int, ...] | None = None  # vocab sizes (--vocab)
    dtypes: tuple[str, ...] | None = None  # logits dtypes (--dtype): float32 for the processed paths
    max_num_seqs: int | None = None  # vLLM max_num_seqs, the batch range (--max-num-seqs)
    paths: tuple[str, ...] | None = None  # PATHS: registry, mrv1, mrv2, ..., attention, mamba
    num_speculative_tokens: int | None = None  # drafts per request (--num-speculative-tokens)
    max_model_len: int | None = None  # vLLM max_model_len (--max-model-len): EAGLE's block-table width
    model_config: str | None = None  # a local Hugging Face config.json (--model-config)
    max_num_batched_tokens: int | None = None  # vLLM max_num_batched_tokens: the MoE token range
    tensor_parallel_size: int | None = None  # vLLM tensor_parallel_size: shards each expert's width
    attention_backend: str | None = None  # vLLM --attention-backend: TRITON_ATTN adds the attention path
    kv_cache_dtype: str | None = None  # vLLM --kv-cache-dtype (attention)
    block_size: int | None = None  # vLLM --block-size: tokens per KV-cache block (runner, attention)
    gdn_prefill_backend: str | None = None  # vLLM --gdn-prefill-backend (gdn's flag, kept as a field of its own)
    serve: tuple[str, ...] | str | None = None  # a serve command (``build -- vllm serve MODEL [flags]``), or its words
    flags: dict | None = None  # the families' other flags (``Family.flags``) by name, None: the file's

    @classmethod
    def of(cls, **values: Any) -> PlanOverrides:
        """The overrides from keyword values, a family flag without a field of its own going into ``flags``."""
        own = {f.name for f in fields(cls)}
        if unknown := set(values) - own - {f.name for f in families.flags()}:
            raise TypeError(f"PlanOverrides got unknown field(s): {', '.join(sorted(unknown))}")
        rest = {**(values.get("flags") or {}), **{k: v for k, v in values.items() if k not in own and v is not None}}
        return cls(**{k: v for k, v in values.items() if k in own and k != "flags"}, flags=rest or None)

    def flag(self, name: str) -> Any:
        """A family flag's value (None: not given)."""
        return getattr(self, name) if name in _OVERRIDE_FIELDS else (self.flags or {}).get(name)

    def __post_init__(self) -> None:
        if isinstance(self.serve, str):  # build(serve="vllm serve MODEL --flag V"): its words
            object.__setattr__(self, "serve", tuple(shlex.split(self.serve)))
        for name in ("gpus", "vocabs", "dtypes", "paths", "serve"):
            value = getattr(self, name)
            object.__setattr__(self, name, tuple(value) if value else None)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> PlanOverrides:
        return cls(**data)


@dataclass(frozen=True)
class BuildPlan:
    name: str
    paths: tuple[str, ...]
    vocabs: tuple[Vocab, ...]
    dtypes: tuple[str, ...]  # float32: the processed paths; bf16/fp16: MRV2's raw-logits Gumbel
    modes: tuple[str, ...]
    gpus: tuple[GpuProfile, ...]
    max_num_seqs: int = 256
    num_speculative_tokens: int = 0
    max_model_len: int = 8192
    max_num_batched_tokens: int = 8192
    tensor_parallel_size: int = 1
    attention_backend: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int = 16  # vLLM's default on CUDA
    gdn_prefill_backend: str = "auto"
    flashinfer_cubins: bool = True  # the serving host reaches NVIDIA's artifactory or has flashinfer-cubin
    model: ModelSpec | None = None
    seeded: bool = True
    unseeded: bool = True
    min_p: bool = True
    fp64_gumbel: bool = False
    source: str = ""
    command: str = ""  # a recipe's serve command, before vLLM resolves it (plan/serve.py)
    model_config: str = ""  # a recipe's config.json for its serve command's model (a hub id's)
    serve: dict | None = None  # what vLLM configured for the serve command (ServeConfig.record())
    flags: dict = field(default_factory=dict)  # the families' flags without a field above (``Family.flags``), by name

    def to_dict(self) -> dict:
        data = asdict(self)
        data["model"] = self.model.to_dict() if self.model else None  # its families' sections by their keys
        for name in ("command", "model_config", "serve", "flags"):  # a plan without them stays as it was
            if not data[name]:
                del data[name]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> BuildPlan:
        return cls(**{
            **data,
            "paths": tuple(data["paths"]),
            "vocabs": tuple(Vocab(v["size"], tuple(v.get("models", ()))) for v in data["vocabs"]),
            "dtypes": tuple(data["dtypes"]),
            "modes": tuple(data["modes"]),
            "gpus": tuple(GpuProfile(**g) for g in data["gpus"]),
            "model": ModelSpec.from_dict(data["model"]) if data.get("model") else None,
        })

    def flag(self, name: str) -> str:
        """The value of a family's flag (``Family.flags``): its field, or ``flags``, or the flag's default."""
        if name in _PLAN_FIELDS:
            return getattr(self, name)
        return self.flags.get(name, next(f.default for f in families.flags() if f.name == name))

    @property
    def layer_dtypes(self) -> tuple[str, ...]:
        """The dtypes the model's layers (MoE, Mamba) run in: the plan's non-fp32 dtypes, else the model's."""
        return tuple(d for d in self.dtypes if d != "float32") or ((self.model.dtype,) if self.model else ())

    def for_arch(self, arch: str) -> tuple[GpuProfile, ...]:
        return tuple(g for g in self.gpus if g.arch == arch)

    def override(self, overrides: PlanOverrides | None = None, **flags: Any) -> BuildPlan:
        """Command-line flags over the file, checked like the file (a bad flag is a usage error).

        ``overrides`` or the same fields as keywords (``plan.override(paths=["mrv2"])``)."""
        given = overrides or PlanOverrides.of(**flags)
        try:
            plan = self._override_model(given) if given.model_config else self
            plan = plan._override(given.gpus, given.vocabs, given.dtypes, given.max_num_seqs, given.paths)
            plan = plan._override_serving(given.num_speculative_tokens, given.max_model_len)
            plan = plan._override_attention(given.attention_backend, given.kv_cache_dtype, given.block_size,
                                            explicit_paths=bool(given.paths))
            plan = plan._override_flags(given)
            return plan._override_batching(given.max_num_batched_tokens, given.tensor_parallel_size)
        except RecipeError as exc:
            raise UsageError(str(exc)) from None

    def served(self, config: ServeConfig, name: str) -> BuildPlan:
        """The plan for what vLLM configured: the model's vocab, dtype and layers, vLLM's limits, block size, KV-cache
        dtype, TP, drafts and attention backend; the paths the model needs (the recipe's named paths kept)."""
        model = parse_model(config.hf_config, config.command, name)
        plan = replace(
            self, model=model, name=_plain_name(name), vocabs=(Vocab(config.vocab_size, (name,)),),
            dtypes=tuple(dict.fromkeys(("float32", config.dtype))), max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len, max_num_batched_tokens=config.max_num_batched_tokens,
            tensor_parallel_size=config.tensor_parallel_size, block_size=config.block_size,
            kv_cache_dtype=config.kv_cache_dtype if config.kv_cache_dtype in KV_CACHE_DTYPES else "auto",
            attention_backend=config.attention_backend if config.attention_backend in ATTENTION_BACKENDS else "auto",
            num_speculative_tokens=config.num_speculative_tokens,
            **_flag_fields({f.name: _served_flag(config, f) for f in families.flags()}, self.flags),
            command="", model_config="", serve=config.record())
        if self.paths != families.names():  # the recipe named its paths
            _check_spec_decode(plan.paths, plan.num_speculative_tokens, self.source or "serve command")
        else:
            plan = replace(plan, paths=tuple(p for p in plan.paths if _wanted(families.get(p), plan)))
        _check_families(plan, config.command)
        return plan

    def _override_model(self, given: PlanOverrides) -> BuildPlan:
        """--model-config: the model's vocab, its dtype (with fp32, the processed paths'), its name for the
        bundle, Model Runner V2's kernels, for a mixture-of-experts model the moe path, for a hybrid model
        the mamba or gdn path and, when the plan serves with the Triton attention backend, the attention path
        (unless --path says otherwise)."""
        model = load_config(given.model_config)
        wanted = tuple(f.name for f in families.by_model_rank() if f.from_model(model, self))
        paths = tuple(p for p in self.paths if not families.get(p).model.owned) + tuple(
            p for p in wanted if p not in self.paths)
        return replace(self, model=model, name=_plain_name(model.name), paths=paths,
                       vocabs=(Vocab(model.vocab_size, (model.name,)),), dtypes=_model_dtypes(model))

    def _override_batching(self, max_num_batched_tokens, tensor_parallel_size) -> BuildPlan:
        where = "command line"
        changes: dict[str, Any] = {}
        if max_num_batched_tokens is not None:
            changes["max_num_batched_tokens"] = _positive(max_num_batched_tokens, "--max-num-batched-tokens", where)
        if tensor_parallel_size is not None:
            changes["tensor_parallel_size"] = _positive(tensor_parallel_size, "--tensor-parallel-size", where)
        plan = replace(self, **changes)
        _check_families(plan, where)
        return plan

    def _override_flags(self, given: PlanOverrides) -> BuildPlan:
        """The families' flags given on the command line, each checked against the values its family builds."""
        values = {f.name: _choice(given.flag(f.name), f.choices, f.vllm, "command line") for f in families.flags()
                  if given.flag(f.name) is not None}
        return replace(self, **_flag_fields(values, self.flags)) if values else self

    def _override_attention(self, backend, kv_cache_dtype, block_size, explicit_paths: bool) -> BuildPlan:
        """--attention-backend TRITON_ATTN adds the attention path and FLASHINFER the flashinfer_attention path (for
        a model; a named backend drops the other's, auto keeps what the plan has) unless --path named the paths;
        --kv-cache-dtype and --block-size set what their kernels are built for."""
        where = "command line"
        changes: dict[str, Any] = {}
        if backend is not None:
            changes["attention_backend"] = _choice(backend, ATTENTION_BACKENDS, "--attention-backend", where)
            if not explicit_paths and backend != "auto":
                others = tuple(p for p in self.paths if p not in ("attention", "flashinfer_attention"))
                changes["paths"] = others + (("attention",) if backend == TRITON_ATTN else ()) + (
                    ("flashinfer_attention",) if backend == FLASHINFER and self.model is not None else ())
        if kv_cache_dtype is not None:
            changes["kv_cache_dtype"] = _choice(kv_cache_dtype, KV_CACHE_DTYPES, "--kv-cache-dtype", where)
        if block_size is not None:
            changes["block_size"] = _positive(block_size, "--block-size", where)
        plan = replace(self, **changes)
        _check_families(plan, where, only="attention")
        _check_families(plan, where, only="flashinfer_attention")
        return plan

    def _override_serving(self, num_speculative_tokens, max_model_len) -> BuildPlan:
        changes: dict[str, Any] = {}
        if num_speculative_tokens is not None:
            changes["num_speculative_tokens"] = _natural(num_speculative_tokens, "--num-speculative-tokens",
                                                         "command line")
        if max_model_len is not None:
            changes["max_model_len"] = _positive(max_model_len, "--max-model-len", "command line")
        plan = replace(self, **changes)
        _check_spec_decode(plan.paths, plan.num_speculative_tokens, "command line")
        return plan

    def _override(self, gpus, vocabs, dtypes, max_num_seqs, paths) -> BuildPlan:
        where = "command line"
        changes: dict[str, Any] = {}
        if gpus:
            changes["gpus"] = tuple(_profile(g, where, {}) for g in gpus)
        if vocabs:
            changes["vocabs"] = tuple(Vocab(_positive(v, "--vocab", where)) for v in vocabs)
        if dtypes:
            changes["dtypes"] = _choices(dtypes, DTYPES, "--dtype", where)
        if max_num_seqs is not None:
            changes["max_num_seqs"] = _positive(max_num_seqs, "--max-num-seqs", where)
        if paths:
            changes["paths"] = _choices(paths, families.names(), "--path", where)
        return replace(self, **changes)


_PLAN_FIELDS = {f.name for f in fields(BuildPlan)}
_OVERRIDE_FIELDS = {f.name for f in fields(PlanOverrides)}
_TOP_KEYS = {"name", "description", "gpus", "vllm", "vocab", "gpu", "model", "serve", "model_config"}
_VLLM_KEYS = {"paths", "max_num_seqs", "num_speculative_tokens", "max_model_len", "modes", "seeded", "unseeded",
              "logits_dtypes", "min_p", "fp64_gumbel", "max_num_batched_tokens", "tensor_parallel_size",
              "attention_backend", "kv_cache_dtype", "block_size", "flashinfer_cubins"}  # and the families' flags


def load(recipe: str | os.PathLike | None = None) -> BuildPlan:
    """Read and validate a recipe: a shipped recipe's name or a TOML file (``resolve``); None: the default."""
    file = resolve(recipe)
    where = _where(file)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"{where}: no such build recipe") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"{where}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{where}: not valid TOML: {exc}") from None
    plan = parse(data, where)
    if plan.model_config and not Path(plan.model_config).is_absolute():
        plan = replace(plan, model_config=str(file.resolve().parent / plan.model_config))
    return plan


def shipped() -> dict[str, Path]:
    """The recipes the package ships, by name (the file's stem): the default, kernelcache/recipes/*.toml, then
    models/*.toml."""
    top = sorted(RECIPES.glob("*.toml"), key=lambda file: (file.stem != DEFAULT_RECIPE, file.stem))
    files = [*top, *sorted(RECIPES.glob("models/*.toml"))]
    return {file.stem: file for file in files}


def resolve(recipe: str | os.PathLike | None = None) -> Path:
    """The file ``recipe`` names: a shipped recipe (a plain word: no directory, no ``.toml``) or a path."""
    text = DEFAULT_RECIPE if recipe is None else os.fspath(recipe)
    plain_word = "/" not in text and os.sep not in text and not text.endswith(".toml")
    if plain_word and text in (found := shipped()):
        return found[text]
    if plain_word and not Path(text).is_file():
        raise RecipeError(f"{text}: no such build recipe (shipped: {', '.join(found)}; or give a TOML file's path)")
    return Path(text)


def _where(file: Path) -> str:
    """How errors and the plan name a recipe file: a shipped one relative to the package, any other as given."""
    if file.parent in (RECIPES, RECIPES / "models"):
        return file.relative_to(RECIPES.parents[1]).as_posix()
    return str(file)


def parse(data: dict, where: str) -> BuildPlan:
    _known(data, _TOP_KEYS, "", where)
    vllm = _table(data.get("vllm", {}), "vllm", where)
    _known(vllm, _VLLM_KEYS | {f.name for f in families.flags()}, "vllm.", where)
    custom = _table(data.get("gpu", {}), "gpu", where)
    model = _model(data["model"], where, str(data.get("name", ""))) if "model" in data else None
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise RecipeError(f"{where}: 'gpus' must be a non-empty list of GPU profile names")
    default_dtypes = list(_model_dtypes(model)) if model else list(DTYPES)
    plan = BuildPlan(
        name=_file_word(data.get("name", Path(where).stem), "name", where),
        paths=_choices(vllm.get("paths", list(families.names())), families.names(), "vllm.paths", where),
        vocabs=_vocabs(data.get("vocab"), model, where) if "serve" not in data else (),
        dtypes=_choices(vllm.get("logits_dtypes", default_dtypes), DTYPES, "vllm.logits_dtypes", where),
        modes=_choices(vllm.get("modes", list(MODES)), MODES, "vllm.modes", where),
        gpus=tuple(_profile(g, where, custom) for g in gpus),
        max_num_seqs=_positive(vllm.get("max_num_seqs", 256), "vllm.max_num_seqs", where),
        num_speculative_tokens=_natural(vllm.get("num_speculative_tokens", 0), "vllm.num_speculative_tokens", where),
        max_model_len=_positive(vllm.get("max_model_len", 8192), "vllm.max_model_len", where),
        max_num_batched_tokens=_positive(vllm.get("max_num_batched_tokens", 8192), "vllm.max_num_batched_tokens",
                                         where),
        tensor_parallel_size=_positive(vllm.get("tensor_parallel_size", 1), "vllm.tensor_parallel_size", where),
        attention_backend=_choice(vllm.get("attention_backend", "auto"), ATTENTION_BACKENDS, "vllm.attention_backend",
                                  where),
        kv_cache_dtype=_choice(vllm.get("kv_cache_dtype", "auto"), KV_CACHE_DTYPES, "vllm.kv_cache_dtype", where),
        block_size=_positive(vllm.get("block_size", 16), "vllm.block_size", where),
        **_flag_fields({f.name: _choice(vllm.get(f.name, f.default), f.choices, f"vllm.{f.name}", where)
                        for f in families.flags()}, {}),
        flashinfer_cubins=_bool(vllm.get("flashinfer_cubins", True), "vllm.flashinfer_cubins", where),
        model=model,
        seeded=_bool(vllm.get("seeded", True), "vllm.seeded", where),
        unseeded=_bool(vllm.get("unseeded", True), "vllm.unseeded", where),
        min_p=_bool(vllm.get("min_p", True), "vllm.min_p", where),
        fp64_gumbel=_bool(vllm.get("fp64_gumbel", False), "vllm.fp64_gumbel", where),
        source=where,
        command=_string(data["serve"], "serve", where) if "serve" in data else "",
        model_config=_recipe_file(data["model_config"], where) if "model_config" in data else "",
    )
    if plan.command:  # the serve command decides the rest when vLLM resolves it (build.planned)
        return plan
    if "paths" not in vllm:  # the default (every path): moe only for a MoE model, attention only with TRITON_ATTN
        plan = replace(plan, paths=tuple(p for p in plan.paths if families.get(p).default(plan)))
    else:  # named on purpose: the default runs the spec-decode paths only with drafts
        _check_spec_decode(plan.paths, plan.num_speculative_tokens, where)
    _check_families(plan, where)
    return plan


def _flag_fields(values: dict[str, str], flags: dict) -> dict[str, Any]:
    """``BuildPlan`` fields for the families' flag ``values``: a flag with a field of its own there (gdn's), the
    others in ``flags`` (over ``flags``, the plan's)."""
    rest = {k: v for k, v in values.items() if k not in _PLAN_FIELDS}
    return {**{k: v for k, v in values.items() if k in _PLAN_FIELDS}, **({"flags": {**flags, **rest}} if rest else {})}


def _served_flag(config: ServeConfig, flag) -> str:
    """What vLLM configured for a family's flag: ``ServeConfig``'s field of its name, else the command's value; a
    value kernelcache does not build for is the flag's default."""
    value = getattr(config, flag.name, None) or ServeCommand.parse(config.command).value(flag.vllm)
    return value if value in flag.choices else flag.default


def _recipe_file(value: Any, where: str) -> str:
    """A file a recipe names (``load`` makes it relative to the recipe's folder)."""
    return _string(value, "model_config", where)


def _model(table: Any, where: str, name: str) -> ModelSpec:
    _known(_table(table, "model", where), recipe_keys(), "model.", where)
    return parse_model(table, where, name)


def _vocabs(entries: Any, model: ModelSpec | None, where: str) -> tuple[Vocab, ...]:
    if entries is None and model is not None:
        return (Vocab(model.vocab_size, (model.name,)),)
    if not isinstance(entries, list) or not entries:
        raise RecipeError(f"{where}: 'vocab' must be a non-empty array of tables ([[vocab]]), or give a [model]")
    return tuple(_vocab(v, i, where) for i, v in enumerate(entries))


def _model_dtypes(model: ModelSpec) -> tuple[str, ...]:
    """fp32 (the processed sampler paths) and the dtype the model serves in."""
    return tuple(dict.fromkeys(("float32", model.dtype)))


def _wanted(family, plan: BuildPlan) -> bool:
    """Whether a plan that names no paths gets ``family``: its default, and drafts where it needs them."""
    return family.default(plan) and (plan.num_speculative_tokens > 0 or not family.needs_drafts)


def _check_spec_decode(paths: tuple[str, ...], num_speculative_tokens: int, where: str) -> None:
    for family in families.families():
        if family.needs_drafts and family.name in paths and num_speculative_tokens < 1:
            raise RecipeError(f"{where}: the {family.name} path needs num_speculative_tokens >= 1 (drafts per request)")


def _check_families(plan: BuildPlan, where: str, only: str | None = None) -> None:
    """Each planned family's own check (moe's model, attention's backend, ...), in the families' model order."""
    for family in families.by_model_rank():
        if family.name in plan.paths and only in (None, family.name):
            family.check(plan, where)


def _plain_name(name: str) -> str:
    """A model's name as a bundle-file word: anything but letters, digits and . _ + - becomes '-'."""
    return re.sub(r"[^A-Za-z0-9._+-]", "-", name).strip("-._+")[:64] or "model"


def _known(table: dict, keys: set[str], prefix: str, where: str) -> None:
    for key in table:
        if key not in keys:
            raise RecipeError(f"{where}: unknown key '{prefix}{key}' (known: {', '.join(sorted(keys))})")


def _table(value: Any, key: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise RecipeError(f"{where}: '{key}' must be a table")
    return value


def _vocab(entry: Any, index: int, where: str) -> Vocab:
    key = f"vocab[{index}]"
    entry = _table(entry, key, where)
    _known(entry, {"size", "models"}, f"{key}.", where)
    models = entry.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise RecipeError(f"{where}: '{key}.models' must be a list of strings")
    return Vocab(_positive(entry.get("size"), f"{key}.size", where), tuple(models))


def _profile(name: Any, where: str, custom: dict) -> GpuProfile:
    if not isinstance(name, str):
        raise RecipeError(f"{where}: GPU profile names must be strings, got {name!r}")
    if name in custom:
        _file_word(name, f"gpu.{name}", where)
        spec = _table(custom[name], f"gpu.{name}", where)
        _known(spec, {"arch", "sm_count", "product"}, f"gpu.{name}.", where)
        arch = _string(spec.get("arch"), f"gpu.{name}.arch", where)
        if not _plain_arch(arch):
            raise RecipeError(f"{where}: 'gpu.{name}.arch' must look like sm_90, got {arch!r}")
        return GpuProfile(name, arch, _positive(spec.get("sm_count"), f"gpu.{name}.sm_count", where),
                          str(spec.get("product", name)))
    if name.lower() not in PROFILES:
        known = ", ".join(sorted(PROFILES))
        raise RecipeError(f"{where}: unknown GPU profile {name!r} (known: {known}; or define [gpu.{name}])")
    return PROFILES[name.lower()]


def _plain_arch(arch: str) -> bool:
    """``sm_90``, exactly: what a GPU profile names (no ``a``/``f`` suffix, no bare number)."""
    try:
        return capability_to_arch(arch_to_capability(arch)) == arch
    except ValueError:
        return False


def _choices(values: Any, allowed: tuple[str, ...], key: str, where: str) -> tuple[str, ...]:
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple)) or not values:
        raise RecipeError(f"{where}: '{key}' must be a non-empty list")
    for value in values:
        if value not in allowed:
            raise RecipeError(f"{where}: '{key}' has unknown value {value!r} (allowed: {', '.join(allowed)})")
    return tuple(dict.fromkeys(values))


def _choice(value: Any, allowed: tuple[str, ...], key: str, where: str) -> str:
    if value not in allowed:
        raise RecipeError(f"{where}: '{key}' must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _positive(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RecipeError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return value


def _natural(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RecipeError(f"{where}: '{key}' must be a non-negative integer, got {value!r}")
    return value


def _bool(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise RecipeError(f"{where}: '{key}' must be true or false, got {value!r}")
    return value


_FILE_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def _file_word(value: Any, key: str, where: str) -> str:
    """Names that become part of a bundle's file name: one plain word, no path."""
    text = _string(value, key, where)
    if not _FILE_WORD.fullmatch(text):
        raise RecipeError(f"{where}: '{key}' must be a plain name (letters, digits, . _ + -; it names the "
                                f"bundle file), got {text!r}")
    return text


def _string(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise RecipeError(f"{where}: '{key}' must be a non-empty string")
    return value



# -- the serve command ----------------------------------------------------------------------------------------

CONFIGS = RECIPES / "models" / "configs"  # shipped config.json files by hub id: ORG--NAME.json


def known_config(model: str) -> Path | None:
    """The config.json kernelcache ships for a hub id (``meta-llama/Llama-3.1-8B-Instruct``), if any."""
    file = CONFIGS / (model.replace("/", "--") + ".json")
    return file if "/" in model and file.is_file() else None


@dataclass(frozen=True)
class ServeRequest:
    """A serve command to resolve: ``local`` names a directory holding the model's config.json; ``shown`` is the
    command as the user wrote it (a hub id stays a hub id); ``name`` names the bundle."""

    local: ServeCommand
    shown: str
    name: str


def serve_request(plan: BuildPlan, given: PlanOverrides) -> ServeRequest | None:
    """The serve command a build resolves, or None for a plan without one (a vocab-only recipe, a [model] table).

    ``build -- vllm serve MODEL [flags]`` wins over the recipe's ``serve``; kernelcache's flags become vLLM flags
    after it (``shorthand_words``: vLLM's parser takes the last value). ``--model-config`` alone is the shorthand
    ``vllm serve <its folder> [flags]``."""
    extra = shorthand_words(_vllm_flags(given))
    if given.serve:
        command = ServeCommand.parse(given.serve)
    elif plan.command:
        command = ServeCommand.parse(plan.command)
    elif given.model_config:
        _readable(given.model_config)
        if not _hugging_face_config(given.model_config):
            return None  # a config.json of only the fields kernelcache reads: kernelcache's own planning
        folder = Path(given.model_config).parent
        return ServeRequest(ServeCommand((str(_staged(Path(given.model_config), folder.name)),)).plus(extra),
                            ServeCommand((str(folder),)).plus(extra).text, _model_name(folder.name))
    else:
        return None
    config = given.model_config or plan.model_config or known_config(command.model)
    shown = command.plus(extra)
    if Path(command.model).is_dir() and not given.model_config:
        return ServeRequest(shown, shown.text, _model_name(command.model))
    if config is None:
        raise RecipeError(f"{command.model}: not a local model directory and no config for it: give its config.json "
                          f"with --model-config (nothing is fetched)")
    _readable(config)
    staged = _staged(Path(config), command.model)
    return ServeRequest(shown.with_model(str(staged)), shown.text, _model_name(command.model))


def _readable(config: str | os.PathLike) -> None:
    """kernelcache's own reading of a config.json first: a missing or bad field is named with its file, in one line
    (a usage error, as for the other flags), before vLLM reads it."""
    try:
        load_config(config)
    except RecipeError as exc:
        raise UsageError(str(exc)) from None


def _hugging_face_config(config: str | os.PathLike) -> bool:
    """Whether vLLM can read the file as a model's config: transformers needs its ``model_type``."""
    try:
        return "model_type" in json.loads(Path(config).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def _vllm_flags(given: PlanOverrides) -> dict[str, Any]:
    return {**{name: getattr(given, name) for name in (*SHORTHAND, "num_speculative_tokens")},
            **{f.name: given.flag(f.name) for f in families.flags()}}


def _model_name(model: str) -> str:
    return Path(model.rstrip("/")).name or model


def _staged(config: Path, model: str) -> Path:
    """A folder holding only ``config`` as config.json (vLLM reads a local model's config from its folder), under
    the user cache dir, named by the config's bytes and the model's name."""
    import hashlib

    try:
        data = config.read_bytes()
    except FileNotFoundError:
        raise RecipeError(f"{config}: no such model config") from None
    except OSError as exc:
        raise RecipeError(f"{config}: cannot read: {exc}") from None
    folder = user_cache("serve", "models", hashlib.sha256(data).hexdigest()[:16], _model_name(model))
    if not (folder / "config.json").is_file() or (folder / "config.json").read_bytes() != data:
        folder.mkdir(parents=True, exist_ok=True)
        scratch = folder / f"config.json.{os.getpid()}.tmp"
        scratch.write_bytes(data)
        os.replace(scratch, folder / "config.json")
    return folder
