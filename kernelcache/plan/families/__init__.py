"""The registry of vLLM families: the one place the house learns which build paths exist.

The built-in families are registered below in the order plans, ``--path`` and bundles have always listed
their paths (a plan records its paths, so the order is part of a bundle's bytes); ``register`` adds one more
(a test's family, or a plug-in), after them. ``KERNELCACHE_FAMILIES`` names plug-ins the way Triton's
``TRITON_CACHE_MANAGER`` names a cache manager: ``module:ATTRIBUTE`` (comma-separated), each a ``Family``
registered when this module is first imported, so that the CLI's options already have its flags. Everything else
(plan/recipe.py's checks, defaults and flags, plan/serve.py's shorthand, plan/tasks.py's exercise units,
plan/targets.py's installed-module and device-name checks, the build's FlashInfer modules, the CLI's ``--path``
help and flags, verify through the plan, docs/FAMILIES.md) asks this module.
"""

from __future__ import annotations

import importlib
import os

from ...errors import UsageError
from ..family import MODEL, VOCAB, About, Family, Flag, ModelRole
from ..releases import SUPPORTED
from . import (
    attention,
    flashinfer_attention,
    gdn,
    mamba,
    moe,
    mrv2_spec_decode,
    runner,
    sampler,
    spec_decode,
    torch_compile,
)

BUILTIN = (sampler.REGISTRY, sampler.MRV1, sampler.MRV2, sampler.FLASHINFER, spec_decode.FAMILY,
           mrv2_spec_decode.FAMILY, moe.FAMILY, runner.FAMILY, attention.FAMILY, mamba.FAMILY, gdn.FAMILY,
           flashinfer_attention.FAMILY, torch_compile.FAMILY)
_FAMILIES: dict[str, Family] = {f.name: f for f in BUILTIN}


def register(family: Family) -> Family:
    """Add ``family`` after the others; a name already taken is a ``ValueError``."""
    if family.name in _FAMILIES:
        raise ValueError(f"a family named {family.name!r} is already registered")
    taken = {f.name for f in flags()} | set(ENGINE_FLAGS)
    if clash := [f.vllm for f in family.flags if f.name in taken]:
        raise ValueError(f"{family.name}: the flag(s) {', '.join(clash)} are already declared")
    _FAMILIES[family.name] = family
    return family


def _plug_ins(value: str) -> None:
    """Register each ``module:ATTRIBUTE`` of ``value`` (``KERNELCACHE_FAMILIES``)."""
    for spec in filter(None, (part.strip() for part in value.split(","))):
        module, _, attribute = spec.partition(":")
        try:
            family = getattr(importlib.import_module(module), attribute or "FAMILY")
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"KERNELCACHE_FAMILIES: cannot load {spec}: {exc}") from None
        register(family)


def unregister(name: str) -> None:
    """Drop a family ``register`` added (a built-in one stays)."""
    if name in {f.name for f in BUILTIN}:
        raise ValueError(f"{name!r} is a built-in family")
    _FAMILIES.pop(name, None)


def families() -> tuple[Family, ...]:
    """Every family, in path order."""
    return tuple(_FAMILIES.values())


def names() -> tuple[str, ...]:
    """Every path name, in path order: what a recipe's ``vllm.paths`` and ``--path`` accept."""
    return tuple(_FAMILIES)


def get(name: str) -> Family:
    return _FAMILIES[name]


def flags() -> tuple[Flag, ...]:
    """The vLLM serve flags the families declare, in path order: the CLI's options, a recipe's ``[vllm]`` keys,
    the serve command's shorthand."""
    return tuple(flag for family in _FAMILIES.values() for flag in family.flags)


def device_keyed() -> tuple[str, ...]:
    """The paths whose kernels vLLM configures by the GPU's device name (a bundle per product)."""
    return tuple(f.name for f in _FAMILIES.values() if f.keys_follow_device)


def flashinfer(how: str | None = None) -> tuple[str, ...]:
    """The paths that build FlashInfer modules; ``how``: only those built that way ("built" or "tasks")."""
    return tuple(f.name for f in _FAMILIES.values() if f.flashinfer and how in (None, f.flashinfer))


def by_model_rank() -> tuple[Family, ...]:
    """The families in the order a model config adds paths and the plan checks them."""
    return tuple(sorted(_FAMILIES.values(), key=lambda f: f.model.rank))


def path_help() -> str:
    """``--path``'s help: every path, consecutive ones with the same note grouped ("a and b (need drafts)")."""
    groups: list[tuple[str, list[str]]] = []
    for family in _FAMILIES.values():
        if groups and groups[-1][0] == family.about.note:
            groups[-1][1].append(family.name)
        else:
            groups.append((family.about.note, [family.name]))
    parts = [", ".join(names) if not note else f"{', '.join(names[:-1])} and {names[-1]} ({note})"
             if len(names) > 1 else f"{names[0]} ({note})" for note, names in groups]
    return f"Path(s): {', '.join(parts)}."


def table() -> str:
    """The family table of docs/FAMILIES.md (scripts/family_table.py writes it; tests check the copy)."""
    rows = ["| path | unit | what it builds | exercise | reads | key probe | GPU check | proven |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in _FAMILIES.values():
        about = f.about
        cells = (f"`{f.name}`", f.unit or "—", about.summary, f"`{f.exercise}`", ", ".join(about.reads),
                 f"`{about.probe}`" if about.probe else "—",
                 f"`tests/gpu_checks/{about.gpu_check}.py`" if about.gpu_check else "—", about.proven or "—")
        rows.append(f"| {' | '.join(cells)} |")
    return "\n".join(rows) + "\n"


def release_matrix() -> dict:
    """The family x vLLM-release table as JSON (``kernelcache recipes --json``): the supported releases and, per
    path, the releases that have it (and why a supported one lacks it)."""
    return {"supported": list(SUPPORTED), "paths": {f.name: {"releases": list(f.about.releases),
                                                            **({"lacks": f.about.lacks} if f.about.lacks else {})}
                                                    for f in _FAMILIES.values()}}


def release_table() -> str:
    """The family x vLLM-release table of docs/FAMILIES.md (scripts/family_table.py writes it)."""
    rows = [f"| path | {' | '.join(f'vLLM {r}' for r in SUPPORTED)} | contact points | of them release-specific |",
            f"| --- | {' | '.join('---' for _ in SUPPORTED)} | --- | --- |"]
    for f in _FAMILIES.values():
        cells = ["yes" if r in f.about.releases else "no" for r in SUPPORTED]
        names = dict.fromkeys(c.name for c in f.about.contacts)
        rows.append(f"| `{f.name}` | {' | '.join(cells)} | {len(names)} | "
                    f"{', '.join(f'`{n}`' for n in names if _differs(f, n)) or '—'} |")
    notes = dict.fromkeys(f.about.lacks for f in _FAMILIES.values() if f.about.lacks)
    return "\n".join(rows) + "\n" + "".join(f"\n{note}.\n" for note in notes)


def _differs(family: Family, name: str) -> bool:
    """Whether the contact ``name`` differs between the releases that have ``family`` (moved, changed, gone)."""
    named = [c for c in family.about.contacts if c.name == name]
    return len(named) > 1 or not set(family.about.releases) <= set(named[0].releases)


# vLLM's serve flags kernelcache takes as shorthands for every family (plan/serve.py SHORTHAND): no family
# declares one of these.
ENGINE_FLAGS = ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "tensor_parallel_size",
                "attention_backend", "kv_cache_dtype", "block_size", "num_speculative_tokens")
_plug_ins(os.environ.get("KERNELCACHE_FAMILIES", ""))

__all__ = ["BUILTIN", "ENGINE_FLAGS", "MODEL", "VOCAB", "About", "Family", "Flag", "ModelRole", "by_model_rank",
           "device_keyed", "families", "flags", "flashinfer", "get", "names", "path_help", "register",
           "release_matrix", "release_table", "table", "unregister"]
