"""Reading a model config's fields (a Hugging Face ``config.json`` or a recipe's ``[model]`` table): an error
names the file and the field. plan/model.py reads the fields every model has; a family reads its own layers'
(plan/families/: ``Family.model.section``)."""

from __future__ import annotations

from typing import Any

from ..errors import RecipeError


def integer(fields: dict, key: str, where: str, default: int | None = None) -> int:
    """A positive integer (zero when a default is given); a config's null means the default (Mistral's
    head_dim)."""
    value: Any = fields.get(key)
    value = default if value is None else value
    if value is None:
        raise RecipeError(f"{where}: the model config has no '{key}'")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and default is None):
        raise RecipeError(f"{where}: model field '{key}' must be a positive integer, got {value!r}")
    return value
