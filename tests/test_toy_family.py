"""A new family is one module plus one registry line (issue 42): a toy family with a vLLM flag, whole in
tests/helpers/toy_family.py, is registered and nothing else is edited. The CLI offers its flag, a recipe takes it,
the serve command's shorthand carries it as the vLLM flag, the plan reaches its kernel with it, and the bundle's
manifest records the path and the flag's value.

Here the one registry line is ``KERNELCACHE_FAMILIES`` (a plug-in, as Triton's ``TRITON_CACHE_MANAGER`` names a
cache manager) or ``families.register``; a built-in family's is its name in plan/families/__init__.py ``BUILTIN``,
plus the docs/FAMILIES.md table scripts/family_table.py regenerates: 2 files outside its own module.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers.common import ROOT, kc
from helpers.toy_family import BLOCK, FAMILY

from kernelcache.errors import RecipeError, UsageError
from kernelcache.plan import families, recipe
from kernelcache.plan.serve import shorthand_words
from kernelcache.plan.tasks import plan_units

PLUG_IN = {"KERNELCACHE_FAMILIES": "helpers.toy_family:FAMILY",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
RECIPE = 'gpus = ["h200"]\n[vllm]\npaths = ["toy"]\ntoy_block = "{}"\n[[vocab]]\nsize = 1000\n'


@pytest.fixture
def toy():
    yield families.register(FAMILY)
    families.unregister(FAMILY.name)


def test_the_package_names_the_toy_nowhere():
    """What picks the toy up learns it from the registry: no file of the package was edited for it."""
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "kernelcache").rglob("*.py")
             if any(word in p.read_text() for word in ("toy_block", "toy-block", "toy_family"))]
    assert not named


def test_a_recipe_takes_the_toys_flag_and_the_plan_hands_it_to_the_task(toy, tmp_path):
    file = tmp_path / "toy.toml"
    file.write_text(RECIPE.format("128"))
    plan = recipe.load(str(file))
    assert plan.paths == ("toy",) and plan.flag("toy_block") == "128"
    assert plan_units(plan) == [("1000", (FAMILY.task({"vocab": 1000, "block": 128}),))]
    assert recipe.BuildPlan.from_dict(json.loads(plan.to_json())) == plan  # what verify reads back from a manifest
    assert recipe.load(str(file)).override(paths=["toy"]).flag("toy_block") == "128"
    assert plan.override(flags={"toy_block": "512"}).flag("toy_block") == "512"
    file.write_text(RECIPE.format("100"))
    with pytest.raises(RecipeError, match="'vllm.toy_block' must be one of 256, 128, 512, got '100'"):
        recipe.load(str(file))
    with pytest.raises(UsageError, match="'--toy-block' must be one of 256, 128, 512"):
        plan.override(flags={"toy_block": "64"})


def test_without_the_flag_the_plan_records_its_default(toy):
    plan = recipe.load().override(paths=["toy"], vocabs=[1000])
    assert plan.flag("toy_block") == BLOCK.default == "256" and plan.to_dict()["flags"] == {"toy_block": "256"}


def test_the_built_in_families_plans_write_the_json_they_always_wrote():
    """gdn's flag keeps its field; no other built-in declares one, so a plan has no ``flags`` (bundles keep their
    bytes)."""
    assert [f.vllm for f in families.flags()] == ["--gdn-prefill-backend"]
    data = recipe.load("qwen3-next-80b-a3b").to_dict()
    assert "flags" not in data and "gdn_prefill_backend" in data


def test_the_serve_shorthand_carries_the_toys_flag_as_the_vllm_flag(toy):
    given = recipe.PlanOverrides.of(max_num_seqs=8, toy_block="512")
    assert given.flags == {"toy_block": "512"} and given.flag("toy_block") == "512"
    assert shorthand_words(recipe._vllm_flags(given)) == ("--max-num-seqs", "8", "--toy-block", "512")
    with pytest.raises(TypeError, match="unknown field"):
        recipe.PlanOverrides.of(toy_blok="512")


def test_a_second_family_cannot_declare_a_taken_flag(toy):
    from dataclasses import replace

    class Toy2(type(FAMILY)):
        name = "toy2"

    class Toy3(type(FAMILY)):
        name, flags = "toy3", (replace(BLOCK, vllm="--block-size"),)

    with pytest.raises(ValueError, match="--toy-block are already declared"):
        families.register(Toy2())
    with pytest.raises(ValueError, match="--block-size are already declared"):
        families.register(Toy3())


def test_the_cli_offers_the_flag_of_a_plugged_in_family():
    shown = kc("build", "--help", env=PLUG_IN, check=True).stdout
    assert "--toy-block TEXT" in shown and "vLLM --toy-block (toy): the toy kernel's block." in " ".join(shown.split())
    assert "toy (a test's toy)." in " ".join(shown.split())
    bad = kc("build", "--help", env={**PLUG_IN, "KERNELCACHE_FAMILIES": "helpers.no_such_family:FAMILY"})
    assert bad.returncode != 0 and "KERNELCACHE_FAMILIES: cannot load helpers.no_such_family:FAMILY" in bad.stderr


@pytest.mark.slow
def test_a_plugged_in_family_builds_with_its_flag_into_the_manifest(tmp_path):
    """kernelcache build --path toy --toy-block 128: the kernel is compiled for the flag's block, and the manifest
    records the path and the flag."""
    kc("build", "--path", "toy", "--toy-block", "128", "--vocab", "1000", "--arch", "sm_90", "--gpu", "h200",
       "--mode", "cross", "--jobs", "1", "-o", str(tmp_path / "out"), env={**PLUG_IN, "HOME": str(tmp_path)},
       check=True)
    (bundle,) = (tmp_path / "out").glob("*.tar.zst")
    shown = json.loads(kc("inspect", str(bundle), "--json", check=True).stdout)
    assert shown["build"]["plan"]["paths"] == ["toy"] and shown["build"]["plan"]["flags"] == {"toy_block": "128"}
    assert [(k["name"], k["constexprs"]) for k in shown["kernels"]] == [("toy_double_kernel", {"BLOCK": 128})]
