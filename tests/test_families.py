"""One seam per family (issue 26): every vLLM family is declared once, in the registry (kernelcache/plan/families/),
and the plan, the CLI, verify and docs/FAMILIES.md learn the families from it. A family a test registers is built,
installed and verified like a shipped one."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelcache.cli import main as cli
from kernelcache.errors import RecipeError, UsageError
from kernelcache.plan import families, recipe
from kernelcache.plan.config import integer
from kernelcache.plan.family import MODEL, About, Family, ModelRole, ModelSection, Task
from kernelcache.plan.tasks import plan_units

ROOT = Path(__file__).resolve().parents[1]
# A recipe per family that builds it: the plan the reads test perturbs.
PLANS = {"registry": "vllm-sampler", "mrv1": "vllm-sampler", "mrv2": "vllm-sampler", "flashinfer": "vllm-sampler",
         "mrv1_spec_decode": "vllm-sampler-mrv1-spec", "mrv2_spec_decode": "llama-3.1-8b-eagle3",
         "runner": "llama-3.1-8b", "moe": "qwen3-30b-a3b", "attention": "llama-3.1-8b-triton-attn",
         "mamba": "nemotron-h-8b", "gdn": "qwen3-next-80b-a3b"}


def changed(value):
    """Another value of the same kind: what a recipe or config could have said instead."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return value[:-1] if len(value) > 1 else (*value, "float16")
    return None  # nested records (vocabs, GPU profiles, the model's layer specs): left alone


def perturbed(plan, reads: tuple[str, ...]):
    """(field, plan) for every plan and model field the family does not declare it reads."""
    for f in fields(plan):
        value = changed(getattr(plan, f.name))
        if value is not None and f.name not in reads and f.name not in ("name", "source"):
            yield f.name, replace(plan, **{f.name: value})
    for f in fields(plan.model) if plan.model else ():
        value = changed(getattr(plan.model, f.name))
        if value is not None and f"model.{f.name}" not in reads and f.name != "name":
            yield f"model.{f.name}", replace(plan, model=replace(plan.model, **{f.name: value}))


@pytest.mark.fast
@pytest.mark.parametrize("name", list(PLANS))
def test_a_family_reads_only_the_fields_it_declares(name):
    family = families.get(name)
    plan = recipe.load(PLANS[name]).override(num_speculative_tokens=max(1, recipe.load(PLANS[name])
                                                                        .num_speculative_tokens))
    vocab = plan.vocabs[0].size
    want = family.tasks(plan, vocab)
    assert want or family.unit == "", f"{name}: its recipe plans no task"
    assert {t.label for t in want} <= {name} and {t.call for t in want} <= {family.exercise}
    for field, other in perturbed(plan, family.about.reads):
        assert family.tasks(other, vocab) == want, f"{name} reads {field}, which it does not declare"


@pytest.mark.fast
def test_every_family_names_files_that_exist():
    for family in families.families():
        module, _, function = family.exercise.partition(":")
        source = ROOT / Path(*module.split(".")).with_suffix(".py")
        defined = {n.name for n in ast.parse(source.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert function in defined, f"{family.name}: {family.exercise}"
        about = family.about
        assert not about.probe or (ROOT / about.probe).is_file(), about.probe
        assert not about.gpu_check or (ROOT / "tests/gpu_checks" / f"{about.gpu_check}.py").is_file(), \
            about.gpu_check


@pytest.mark.fast
def test_the_docs_family_table_is_the_registry():
    done = subprocess.run([sys.executable, "scripts/family_table.py", "--check"], cwd=ROOT)
    assert done.returncode == 0, "docs/FAMILIES.md is stale: run python scripts/family_table.py"
    assert families.table() in (ROOT / "docs" / "FAMILIES.md").read_text()


@pytest.mark.fast
def test_the_registry_refuses_a_second_family_of_one_name():
    with pytest.raises(ValueError, match="already registered"):
        families.register(families.get("moe"))
    with pytest.raises(ValueError, match="built-in"):
        families.unregister("moe")


# -- a family the test adds ---------------------------------------------------------------------------------

SELFTEST = "selftest"


class Selftest(Family):
    name = SELFTEST
    exercise = "kernelcache.exercise.testkernels:run"
    about = About("kernelcache's test kernels", ("kernelcache.exercise.testkernels", "kernelcache's test kernels"),
                  note="a test's family")

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        return (self.task(),)

    def default(self, plan) -> bool:
        return False

    def check(self, plan, where: str) -> None:
        if plan.max_num_seqs > 512:
            raise RecipeError(f"{where}: the {SELFTEST} path builds at most 512 sequences")


@pytest.fixture
def selftest():
    """kernelcache's own test kernels as one more family, registered for the test only."""
    family = families.register(Selftest())
    yield family
    families.unregister(SELFTEST)


@pytest.mark.fast
def test_a_registered_family_is_planned_checked_and_listed(selftest, tmp_path):
    plan = recipe.load().override(paths=[SELFTEST], vocabs=[1000])
    assert plan_units(plan) == [("1000", (Task("kernelcache.exercise.testkernels:run", label=SELFTEST),))]
    assert SELFTEST not in recipe.load().paths  # its default says no
    with pytest.raises(UsageError, match="at most 512 sequences"):
        recipe.load().override(paths=[SELFTEST], max_num_seqs=1024)
    file = tmp_path / "r.toml"
    file.write_text('gpus = ["h200"]\n[vllm]\npaths = ["selftest", "mrv2"]\n[[vocab]]\nsize = 1000\n')
    assert [name for name, _ in plan_units(recipe.load(str(file)))] == ["1000"]
    assert [t.label for t in plan_units(recipe.load(str(file)))[0][1]] == ["mrv2", SELFTEST]
    shown = CliRunner().invoke(cli, ["build", "--help"], terminal_width=200).output
    assert "flashinfer_attention (needs --attention-backend FLASHINFER), compile (opt-in: vLLM's torch.compile), " \
           "selftest (a test's family)." in " ".join(shown.split())
    assert f"`{SELFTEST}` | vocab | kernelcache's test kernels" in families.table()


def test_a_registered_family_builds_installs_and_verifies_through_the_cli(selftest, tmp_path, monkeypatch):
    """kernelcache build --path selftest, then install and verify: the CLI, the plan and verify take the family
    from the registry alone (the exercise processes only run its tasks)."""
    for key in [k for k in os.environ if k.startswith(("TRITON_", "KERNELCACHE_", "FLASHINFER_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("KERNELCACHE_BUILD_CACHE", "off")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    runner = CliRunner()
    built = runner.invoke(cli, ["build", "--path", SELFTEST, "--vocab", "1000", "--arch", "sm_90", "--gpu", "h200",
                                "--mode", "cross", "--jobs", "1", "-o", str(tmp_path / "out")])
    assert built.exit_code == 0, built.output
    (bundle,) = (tmp_path / "out").glob("*.tar.zst")
    shown = runner.invoke(cli, ["inspect", str(bundle), "--json"])
    assert json.loads(shown.output)["build"]["plan"]["paths"] == [SELFTEST]
    checked = runner.invoke(cli, ["verify", str(bundle), "--cache-dir", str(tmp_path / "cache"), "--jobs", "1",
                                  "--json"])
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.output)
    assert report["compiles"] == 0 and report["hits"] > 0 and report["tasks"] == 1


# -- a family with its own layers in a model config ---------------------------------------------------------

@dataclass(frozen=True)
class WidgetSpec:
    """The test family's layers: one width, read from the config field ``widget_width``."""

    widget_width: int


def _widget_layers(fields: dict, architecture: str, where: str) -> WidgetSpec | None:
    if architecture != "WidgetForCausalLM":
        return None
    return WidgetSpec(integer(fields, "widget_width", where))


class Widget(Family):
    name = "widget"
    exercise = "kernelcache.exercise.testkernels:run"
    about = About("a test family with model layers", ("kernelcache.exercise.testkernels", "kernelcache's test kernels"))
    unit = MODEL
    model = ModelRole(ModelSection("widget", WidgetSpec, _widget_layers, frozenset({"widget_width"})), owned=True)

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        layers = plan.model.section("widget") if plan.model else None
        return (self.task({"width": layers.widget_width}),) if layers else ()

    def default(self, plan) -> bool:
        return bool(plan.model and plan.model.section("widget"))

    def from_model(self, model, plan) -> bool:
        return model.section("widget") is not None


@pytest.fixture
def widget():
    """A test-only family whose layers a model config describes: registered, never edited into the plan."""
    family = families.register(Widget())
    yield family
    families.unregister("widget")


@pytest.mark.fast
def test_a_registered_family_reads_its_own_layers_from_a_model_config(widget, tmp_path):
    config = tmp_path / "Widget-1B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"architectures": ["WidgetForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
                                  "num_attention_heads": 4, "widget_width": 96}))
    plan = recipe.load().override(model_config=str(config))
    assert plan.model.section("widget") == WidgetSpec(96) and plan.paths[-2:] == ("runner", "widget")
    assert ("model", (Task("kernelcache.exercise.testkernels:run", {"width": 96}, label="widget"),)) in \
        plan_units(plan)
    again = recipe.BuildPlan.from_dict(json.loads(plan.to_json()))
    assert again == plan and again.to_dict()["model"]["widget"] == {"widget_width": 96}
    assert again.to_dict()["model"]["mamba"] is None  # the built-in sections keep their keys
    file = tmp_path / "r.toml"
    file.write_text('gpus = ["h200"]\n[model]\narchitectures = ["WidgetForCausalLM"]\nvocab_size = 1000\n'
                    'hidden_size = 64\nwidget_width = 32\n')
    assert "widget" in recipe.load(str(file)).paths  # its default: a model with such layers
    bad = tmp_path / "Widget-bad" / "config.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"architectures": ["WidgetForCausalLM"], "vocab_size": 1000, "hidden_size": 64}))
    with pytest.raises(UsageError, match="has no 'widget_width'"):
        recipe.load().override(model_config=str(bad))
