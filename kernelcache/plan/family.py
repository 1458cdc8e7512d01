"""The seam every vLLM family plugs into: a ``Family`` declares one build path, and ``Task`` is what it plans.

A family is one path of a recipe (``vllm.paths``, ``--path``): the sampler's ``registry``, ``mrv1``, ``mrv2`` and
``flashinfer``, the spec-decode paths, ``moe``, ``runner``, ``attention``, ``mamba``, ``gdn``. Its declaration
(plan/families/, one module per exercise) says what it reads from the plan and the model config, the tasks it
plans, the exercise entry those tasks call, its independent key probe and its GPU check. The plan, the CLI,
verify and docs/FAMILIES.md learn the families from the registry (plan/families/__init__.py) alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
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


@dataclass(frozen=True)
class About:
    """What a family says of itself to people and to the checks around a build (not to the plan): docs/FAMILIES.md's
    row, the installed-module and vLLM-release checks (plan/targets.py), the GPU check scripts/gpu/prove.py runs."""

    summary: str  # what it builds, one line (docs/FAMILIES.md)
    requires: tuple[str, str]  # (the module that must be installed, what to call it in an error)
    reads: tuple[str, ...] = ()  # the plan and model fields its tasks read (tests/test_families.py holds it to them)
    note: str = ""  # what --path's help says of it in brackets ("needs a MoE model")
    probe: str = ""  # the independent key probe (tests/probes/), from the repository root
    gpu_check: str = ""  # the check scripts/gpu/prove.py runs on a GPU: a file under tests/gpu_checks/
    proven: str = ""  # the GPU its check passed on (BENCHMARKS.md), for docs/FAMILIES.md
    releases: tuple[str, ...] = SUPPORTED  # the vLLM minor releases that have the path (plan/releases.py)
    contacts: tuple[Contact, ...] = ()  # every vLLM internal its exercise imports or calls, per release
    lacks: str = ""  # why a supported release not in ``releases`` lacks the path (the build's refusal says it)


@dataclass(frozen=True)
class ModelRole:
    """How a model config bears on a family: ``section``, its own layers' fields (a hybrid model's Mamba-2 layers,
    which ``ModelSpec.section`` then holds); ``owned``: the model alone decides the path (``--model-config`` drops it
    unless ``Family.from_model`` adds it); ``rank`` orders the paths a model adds and the families' ``check`` calls,
    as plans record and have always recorded them."""

    section: ModelSection | None = None
    owned: bool = False
    rank: int = 100


class Family(ABC):
    """The seam a build path plugs into, as Triton's ``CacheManager`` is the seam a cache plugs into: a family
    subclasses it, sets what it declares and implements ``tasks``; the registry (plan/families/) holds one instance.

    Declared: ``name`` (the path: ``vllm.paths``, ``--path``), ``exercise`` (the ``module:function`` its tasks call,
    written here once: ``task`` makes each), ``about`` (docs and checks), and where they differ from the defaults:
    ``unit`` (VOCAB or MODEL: which exercise process runs its tasks), ``flags`` (the vLLM serve flags its kernels
    depend on, which the CLI, a recipe and the serve shorthand then take), ``keys_follow_device`` (vLLM picks its
    kernels' configs by the GPU's device name: a bundle per product), ``flashinfer`` (its FlashInfer modules: "built"
    when the build compiles the module, "tasks" when its tasks JIT them), ``needs_drafts`` (it runs only with
    num_speculative_tokens >= 1) and ``model`` (how a model config bears on it)."""

    name: str
    exercise: str  # "" when it plans no Triton task
    about: About
    unit: str = VOCAB
    flags: tuple[Flag, ...] = ()
    keys_follow_device: bool = False
    flashinfer: str = ""
    needs_drafts: bool = False
    model: ModelRole = ModelRole()

    @abstractmethod
    def tasks(self, plan: BuildPlan, vocab: int) -> tuple[Task, ...]:
        """The path's exercise tasks for ``plan`` (``vocab`` is 0 for a ``MODEL`` unit), each made by ``task``."""

    def check(self, plan: BuildPlan, where: str) -> None:
        """Raise ``RecipeError`` when the plan cannot build the path (nothing to check by default)."""
        return None

    def default(self, plan: BuildPlan) -> bool:
        """Whether a recipe that names no paths gets this one."""
        return True

    def from_model(self, model: ModelSpec, plan: BuildPlan) -> bool | None:
        """Whether ``--model-config`` adds it (None: the model neither adds nor drops it)."""
        return None

    def task(self, kwargs: dict | None = None) -> Task:
        """One of its tasks: ``exercise`` called with ``kwargs``, labelled with the family's name."""
        return Task(self.exercise, dict(kwargs or {}), label=self.name)

    def planned(self, plan: BuildPlan, vocab: int = 0) -> tuple[Task, ...]:
        """Its tasks for ``plan`` (none when the plan does not name the path)."""
        return self.tasks(plan, vocab) if self.name in plan.paths else ()

    def __repr__(self) -> str:
        return f"<family {self.name}>"
