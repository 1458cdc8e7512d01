"""The seam every vLLM family plugs into: a ``Family`` declares one build path, and ``Task`` is what it plans.

A family is one path of a recipe (``vllm.paths``, ``--path``): the sampler's ``registry``, ``mrv1``, ``mrv2`` and
``flashinfer``, the spec-decode paths, ``moe``, ``runner``, ``attention``, ``mamba``, ``gdn``. Its declaration
(plan/families/, one module per exercise) says what it reads from the plan and the model config, the tasks it
plans, the exercise entry those tasks call, its independent key probe and its GPU check. The plan, the CLI,
verify and docs/FAMILIES.md learn the families from the registry (plan/families/__init__.py) alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .releases import SUPPORTED, Contact

# plan/recipe.py's BuildPlan and plan/model.py's ModelSpec: not imported, not even for type checkers, because both
# modules read the registry, which stands on this module (the house keeps no circle).
BuildPlan = Any
ModelSpec = Any

VOCAB = "vocab"  # one exercise process per vocab size (plan/tasks.py plan_units)
MODEL = "model"  # one exercise process for the model's own layers, whatever the vocab


@dataclass(frozen=True)
class Task:
    """``module:function`` plus keyword arguments; the function returns a JSON-able summary."""

    call: str
    kwargs: dict = field(default_factory=dict)
    label: str = ""


@dataclass(frozen=True)
class Flag:
    """A vLLM serve flag whose value changes a family's kernels (``--gdn-prefill-backend``), declared by the family.

    kernelcache's flag of the same name (``build --gdn-prefill-backend triton``) is a shorthand for it: appended to
    the serve command as that vLLM flag (plan/serve.py ``shorthand_words``), so a build takes one path whichever way
    it was given. A recipe's ``[vllm]`` table takes it under ``name`` (the flag's words joined by underscores), the
    plan keeps its value under that name (``BuildPlan.flag``), and a served plan takes what vLLM configured
    (``ServeConfig``'s field of that name where it has one, else the serve command's value)."""

    vllm: str  # the vLLM serve flag: "--gdn-prefill-backend"
    choices: tuple[str, ...]  # the values kernelcache builds for; the first is the default (vLLM's own)
    help: str  # what build --help says of it

    @property
    def name(self) -> str:
        return self.vllm.removeprefix("--").replace("-", "_")

    @property
    def default(self) -> str:
        return self.choices[0]


@dataclass(frozen=True)
class ModelSection:
    """A family's own layers in a model config: ``parse(fields, architecture, where)`` gives its spec (a frozen
    dataclass) or None for a model without such layers; ``ModelSpec`` keeps it under ``key`` (plans and bundles
    record it there), ``spec`` reads it back from JSON, ``config_keys`` are the fields a recipe's ``[model]``
    table may hold for it."""

    key: str
    spec: type
    parse: Callable[[dict, str, str], object | None]
    config_keys: frozenset[str] = frozenset()


def _always(plan: BuildPlan) -> bool:
    return True


def _no_check(plan: BuildPlan, where: str) -> None:
    return None


def _no_tasks(plan: BuildPlan, vocab: int) -> tuple[Task, ...]:
    return ()


@dataclass(frozen=True)
class Family:
    """One build path and everything the house needs to know about it.

    ``tasks(plan, vocab)`` plans the path's exercise tasks (``vocab`` is 0 for a ``MODEL`` unit), each calling
    ``exercise`` and labelled with the family's name; the plan runs them only when ``name`` is in ``plan.paths``.
    ``default(plan)``: whether a recipe that names no paths gets this one. ``from_model(model, plan)``: whether
    ``--model-config`` adds it (None: the model neither adds nor drops it); ``model_rank`` orders the paths a model
    adds and the families' ``check`` calls, as plans record and have always recorded them. ``check(plan, where)``
    raises ``RecipeError`` when the plan cannot build the path. ``model_section``: the family's own layers in a
    model config (a hybrid model's Mamba-2 layers), which ``ModelSpec.section`` then holds. ``releases`` and
    ``contacts``: the vLLM releases that have the path and the vLLM internals its exercise touches in each
    (plan/releases.py)."""

    name: str
    summary: str  # what it builds, one line (docs/FAMILIES.md)
    exercise: str  # the ``module:function`` its tasks call ("" when it plans no Triton task)
    requires: tuple[str, str]  # (the module that must be installed, what to call it in an error)
    reads: tuple[str, ...] = ()  # the plan and model fields its tasks read
    unit: str = VOCAB  # VOCAB or MODEL: which exercise process runs its tasks
    tasks: Callable[[BuildPlan, int], tuple[Task, ...]] = _no_tasks
    note: str = ""  # what --path's help says of it in brackets ("needs a MoE model")
    needs_drafts: bool = False  # the path runs only with num_speculative_tokens >= 1
    default: Callable[[BuildPlan], bool] = _always
    from_model: Callable[[ModelSpec, BuildPlan], bool] | None = None
    model_section: ModelSection | None = None  # its layers' own fields in a model config
    model_owned: bool = False  # the model alone decides it: --model-config drops it unless from_model adds it
    model_rank: int = 100
    check: Callable[[BuildPlan, str], None] = _no_check
    probe: str = ""  # the independent key probe (tests/probes/), from the repository root
    gpu_check: str = ""  # the check scripts/gpu/prove.py runs on a GPU: a file under scripts/gpu/checks/
    proven: str = ""  # the GPU its check passed on (BENCHMARKS.md), for docs/FAMILIES.md
    releases: tuple[str, ...] = SUPPORTED  # the vLLM minor releases that have the path (plan/releases.py)
    contacts: tuple[Contact, ...] = ()  # every vLLM internal its exercise imports or calls, per release
    lacks: str = ""  # why a supported release not in ``releases`` lacks the path (the build's refusal says it)
    flags: tuple[Flag, ...] = ()  # the vLLM serve flags its kernels depend on that no other family declares
    keys_follow_device: bool = False  # vLLM picks its kernels' configs by the GPU's device name (a bundle per product)
    flashinfer: str = ""  # FlashInfer modules: "built" (the build compiles the module), "tasks" (its tasks JIT them)

    def task(self, kwargs: dict | None = None) -> Task:
        """One of its tasks: ``exercise`` called with ``kwargs``, labelled with the family's name."""
        return Task(self.exercise, dict(kwargs or {}), label=self.name)

    def planned(self, plan: BuildPlan, vocab: int = 0) -> tuple[Task, ...]:
        """Its tasks for ``plan`` (none when the plan does not name the path)."""
        return self.tasks(plan, vocab) if self.name in plan.paths else ()
