"""The build recipes the package ships, as ``kernelcache recipes`` lists them and ``--recipe NAME`` takes them.

Each is read and validated as a build reads it (plan/recipe.py), so a listed recipe is one that builds.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from .families import release_matrix
from .recipe import load, shipped


@dataclass(frozen=True)
class ShippedRecipe:
    name: str  # what --recipe takes (the file's stem, which is also the recipe's name and its bundles')
    file: str  # relative to the package's parent: kernelcache/recipes/models/qwen3-30b-a3b.toml
    description: str
    model: str | None  # the model's architecture (a model recipe), None for a vocab list
    vocabs: tuple[int, ...]
    dtypes: tuple[str, ...]
    paths: tuple[str, ...]  # what it exercises by default (build --path overrides)
    gpus: tuple[str, ...]  # GPU profile names (kernelcache gpus)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> ShippedRecipe:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


@dataclass(frozen=True)
class Catalog:
    recipes: tuple[ShippedRecipe, ...]

    def to_dict(self) -> dict:
        """The recipes, and the family x vLLM-release table (which releases have each path)."""
        return {"recipes": [r.to_dict() for r in self.recipes], "releases": release_matrix()}

    @classmethod
    def from_dict(cls, data: dict) -> Catalog:
        return cls(tuple(ShippedRecipe.from_dict(r) for r in data["recipes"]))


def recipes() -> Catalog:
    """Every recipe the package ships: the sampler recipes first, then the model recipes, each by name."""
    return Catalog(tuple(_describe(name, file) for name, file in shipped().items()))


def _describe(name: str, file: Path) -> ShippedRecipe:
    plan = load(name)
    description = tomllib.loads(file.read_text(encoding="utf-8")).get("description", "")
    return ShippedRecipe(name=name, file=plan.source, description=str(description),
                         model=plan.model.architecture if plan.model else None,
                         vocabs=tuple(v.size for v in plan.vocabs), dtypes=plan.dtypes, paths=plan.paths,
                         gpus=tuple(g.name for g in plan.gpus))
