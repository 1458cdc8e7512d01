"""The registry of vLLM families: the one place the house learns which build paths exist.

The built-in families are registered below in the order plans, ``--path`` and bundles have always listed
their paths (a plan records its paths, so the order is part of a bundle's bytes); ``register`` adds one more
(a test's family, or a plug-in), after them. Everything else (plan/recipe.py's checks and defaults,
plan/tasks.py's exercise units, plan/targets.py's installed-module check, the CLI's ``--path`` help, verify
through the plan, docs/FAMILIES.md) asks this module.
"""

from __future__ import annotations

from ..family import MODEL, VOCAB, Family
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
    _FAMILIES[family.name] = family
    return family


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


def by_model_rank() -> tuple[Family, ...]:
    """The families in the order a model config adds paths and the plan checks them."""
    return tuple(sorted(_FAMILIES.values(), key=lambda f: f.model_rank))


def path_help() -> str:
    """``--path``'s help: every path, consecutive ones with the same note grouped ("a and b (need drafts)")."""
    groups: list[tuple[str, list[str]]] = []
    for family in _FAMILIES.values():
        if groups and groups[-1][0] == family.note:
            groups[-1][1].append(family.name)
        else:
            groups.append((family.note, [family.name]))
    parts = [", ".join(names) if not note else f"{', '.join(names[:-1])} and {names[-1]} ({note})"
             if len(names) > 1 else f"{names[0]} ({note})" for note, names in groups]
    return f"Path(s): {', '.join(parts)}."


def table() -> str:
    """The family table of docs/FAMILIES.md (scripts/family_table.py writes it; tests check the copy)."""
    rows = ["| path | unit | what it builds | exercise | reads | key probe | GPU check | proven |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in _FAMILIES.values():
        cells = (f"`{f.name}`", f.unit or "—", f.summary, f"`{f.exercise}`", ", ".join(f.reads),
                 f"`{f.probe}`" if f.probe else "—", f"`scripts/gpu/checks/{f.gpu_check}.py`" if f.gpu_check else "—",
                 f.proven or "—")
        rows.append(f"| {' | '.join(cells)} |")
    return "\n".join(rows) + "\n"


def release_matrix() -> dict:
    """The family x vLLM-release table as JSON (``kernelcache recipes --json``): the supported releases and, per
    path, the releases that have it (and why a supported one lacks it)."""
    return {"supported": list(SUPPORTED),
            "paths": {f.name: {"releases": list(f.releases), **({"lacks": f.lacks} if f.lacks else {})}
                      for f in _FAMILIES.values()}}


def release_table() -> str:
    """The family x vLLM-release table of docs/FAMILIES.md (scripts/family_table.py writes it)."""
    rows = [f"| path | {' | '.join(f'vLLM {r}' for r in SUPPORTED)} | contact points | of them release-specific |",
            f"| --- | {' | '.join('---' for _ in SUPPORTED)} | --- | --- |"]
    for f in _FAMILIES.values():
        cells = ["yes" if r in f.releases else "no" for r in SUPPORTED]
        names = dict.fromkeys(c.name for c in f.contacts)
        rows.append(f"| `{f.name}` | {' | '.join(cells)} | {len(names)} | "
                    f"{', '.join(f'`{n}`' for n in names if _differs(f, n)) or '—'} |")
    notes = dict.fromkeys(f.lacks for f in _FAMILIES.values() if f.lacks)
    return "\n".join(rows) + "\n" + "".join(f"\n{note}.\n" for note in notes)


def _differs(family: Family, name: str) -> bool:
    """Whether the contact ``name`` differs between the releases that have ``family`` (moved, changed, gone)."""
    named = [c for c in family.contacts if c.name == name]
    return len(named) > 1 or not set(family.releases) <= set(named[0].releases)


__all__ = ["BUILTIN", "MODEL", "VOCAB", "Family", "by_model_rank", "families", "get", "names", "path_help",
           "register", "release_matrix", "release_table", "table", "unregister"]
