"""kernelcache on each supported vLLM release (plan/releases.py): the families' contact points, the version
preflight and, on each release's serving venv, a small build + verify of every family.

* Each family's exercise imports only vLLM internals its declaration names (``contacts=``), and every contact
  of the installed release is there: a new vLLM fails here with the moved symbol named.
* ``kernelcache build`` refuses, in one line and with exit 36, an unsupported vLLM (a real vLLM whose metadata
  says 0.35.0: a dist-info first on the path) and a path the installed release lacks, before any compile.
* Marked ``serving``: scripts/release_rerun.sh (the small config of each path) on the 0.33 venv
  (KERNELCACHE_SERVING_VENV) and the 0.34 one (KERNELCACHE_SERVING_VENV_034), one path per case.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.common import ROOT, clean_env

from kernelcache.errors import ReleaseUnsupported
from kernelcache.plan import families, releases
from kernelcache.plan.family import About, Family
from kernelcache.plan.releases import Contact
from kernelcache.plan.targets import check_release

EXERCISE = ROOT / "kernelcache" / "exercise"


def vllm_imports(module: Path) -> set[str]:
    """Every ``module:symbol`` (or bare module) of vLLM the file imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "vllm":
            found |= {f"{node.module}:{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "vllm"}
    return found


def test_every_vllm_import_of_an_exercise_is_a_contact_of_its_families():
    by_module: dict[str, set[str]] = {}
    for family in families.families():
        module = family.exercise.partition(":")[0].rpartition(".")[2]
        by_module.setdefault(module, set()).update(c.symbol for c in family.about.contacts)
    by_module["fake_runner_ops"] = {c.symbol for c in families.get("runner").about.contacts}
    for module, declared in by_module.items():
        if module == "vllm_sampler" or module.startswith("vllm_") or module == "fake_runner_ops":
            undeclared = vllm_imports(EXERCISE / f"{module}.py") - declared
            assert not undeclared, f"exercise/{module}.py imports vLLM internals no family declares: {undeclared}"


def test_a_release_lacking_a_path_says_why_and_each_contact_names_its_releases():
    for family in families.families():
        assert set(family.about.releases) <= set(releases.SUPPORTED), family.name
        assert bool(family.about.lacks) == (family.about.releases != releases.SUPPORTED), family.name
        for contact in family.about.contacts:
            assert set(contact.releases) & set(family.about.releases), (family.name, contact)
        # one contact per release and name: resolve never has to choose
        for release in family.about.releases:
            names = [c.name for c in releases.current(family.about.contacts, release)]
            assert len(names) == len(set(names)), (family.name, release)


@pytest.mark.parametrize(("version", "release"), [("0.34.0", "0.34"), ("0.34.1rc1", "0.34"),
                                                  ("0.33.0.dev4+gabc", "0.33"), ("1.0", "1.0")])
def test_minor(version, release):
    assert releases.minor(version) == release


def test_the_release_table_is_generated_into_families_md_and_recipes_json():
    assert families.release_table() in (ROOT / "docs" / "FAMILIES.md").read_text()
    done = subprocess.run([sys.executable, "-m", "kernelcache", "recipes", "--json"], capture_output=True, text=True,
                          env=clean_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    matrix = json.loads(done.stdout)["releases"]
    assert matrix["supported"] == list(releases.SUPPORTED)
    assert matrix["paths"]["mrv1"] == {"releases": ["0.33"], "lacks": families.get("mrv1").about.lacks}
    assert matrix["paths"]["runner"] == {"releases": list(releases.SUPPORTED)}


def test_check_release_refuses_an_unknown_release_a_lacking_path_and_a_moved_module():
    with pytest.raises(ReleaseUnsupported, match=r"vllm 0\.35\.0 is installed; kernelcache builds for vllm "
                                                 r"0\.33, 0\.34, not 0\.35: every path is affected \(runner\)"):
        check_release(("runner",), "0.35.0")
    with pytest.raises(ReleaseUnsupported, match=r"0\.34 lacks the path\(s\) mrv1, mrv1_spec_decode \(vLLM 0\.34 "
                                                 r"removed the V1 model runner.*: build --path registry$"):
        check_release(("registry", "mrv1", "mrv1_spec_decode"), "0.34.0")
    class Moved(Family):
        name, exercise = "selftest_moved", ""
        about = About("a family whose contact moved", ("vllm", "vLLM"),
                      contacts=(Contact("gone", "vllm.v1.worker.no_such_module:get_block_table_width"),))

        def tasks(self, plan, vocab: int) -> tuple:
            return ()

    families.register(Moved())
    try:
        with pytest.raises(ReleaseUnsupported, match=r"lacks vllm\.v1\.worker\.no_such_module:get_block_table_width "
                                                     r"\(selftest_moved\)"):
            check_release(("selftest_moved",), "0.33.0")
    finally:
        families.unregister("selftest_moved")


def fake_release(tmp_path: Path, version: str) -> Path:
    """A dist-info that says vLLM is ``version``, to put first on the path: the real vLLM behind it imports."""
    info = tmp_path / "meta" / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return info.parent


@pytest.mark.vllm
@pytest.mark.parametrize(("version", "paths", "says"), [
    ("0.35.0", ("--path", "registry", "--path", "mrv2"), "not 0.35: every path is affected (registry, mrv2)"),
    ("0.34.0", ("--path", "mrv1", "--path", "mrv2"),
     "0.34 lacks the path(s) mrv1 (vLLM 0.34 removed the V1 model runner, its Sampler and its rejection sampler): "
     "build --path mrv2"),
])
def test_build_refuses_before_any_compile(tmp_path, version, paths, says):
    env = clean_env(PYTHONPATH=os.pathsep.join([str(fake_release(tmp_path, version)), str(ROOT)]),
                    TRITON_CACHE_DIR=str(tmp_path / "triton"), KERNELCACHE_BUILD_CACHE=str(tmp_path / "build-cache"))
    start = time.monotonic()
    command = [sys.executable, "-m", "kernelcache", "build", "--arch", "sm_90", "--gpu", "h200", "--vocab", "32000",
               *paths, "-o", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == ReleaseUnsupported.exit_code == 36, (done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and f"vllm {version} is installed" in lines[0], lines
    assert not (tmp_path / "work").exists() and not (tmp_path / "triton").exists()  # nothing ran, nothing compiled
    assert time.monotonic() - start < 120


@pytest.mark.vllm
def test_a_missing_contact_is_named():
    contact = Contact("nothing", "vllm.sampling_params:SamplingParams.no_such_method")
    assert "vllm.sampling_params:SamplingParams.no_such_method is not in the installed vllm" in contact.problem()
    signature = Contact("SamplingParams.clone", "vllm.sampling_params:SamplingParams.clone", params=("self", "x"))
    assert "takes (self) in the installed vllm" in signature.problem()


# As the exercises import them: behind the fake target, and vllm/platforms/cuda.py's stable-ABI extension (it needs
# the driver; nothing calls it) an empty module where it does not load (vllm_flashinfer.py chosen_backend).
CHECK = """
import importlib, json, sys, types
from kernelcache.exercise.drivers import device_scope
from kernelcache.plan import families, releases
try:
    importlib.import_module("vllm._C_stable_libtorch")
except ImportError:
    sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
problems = []
with device_scope():
    for family in families.families():
        if releases.release() in family.about.releases:
            problems += [f"{family.name}: {p}" for c in releases.current(family.about.contacts) if (p := c.problem())]
print(json.dumps({"version": releases.installed(), "problems": problems}))
"""


def contacts_hold(python: str) -> dict:
    """Every contact of ``python``'s vLLM release, imported behind the fake target as the exercises import them."""
    done = subprocess.run([python, "-c", CHECK], capture_output=True, text=True, timeout=900,
                          env=clean_env(PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
@pytest.mark.slow
def test_every_contact_of_the_installed_release_holds():
    found = contacts_hold(sys.executable)
    assert not found["problems"], f"vllm {found['version']}: " + "; ".join(found["problems"])


def release_venv(variable: str) -> Path:
    from test_serving_stack import serving_venv  # skips (or fails under CI) without the venv

    return serving_venv(variable).root


VENVS = {"0.33": "KERNELCACHE_SERVING_VENV", "0.34": "KERNELCACHE_SERVING_VENV_034"}
RERUN = ("registry_mrv2", "mrv1", "runner", "attention", "mrv1_spec_decode", "mrv2_spec_decode", "moe", "mamba",
         "gdn", "flashinfer", "flashinfer_attention")
FAMILY_OF = {"registry_mrv2": "mrv2"}


@pytest.mark.serving
@pytest.mark.slow
@pytest.mark.parametrize("release", list(VENVS))
def test_contacts_hold_on_each_release(release):
    root = release_venv(VENVS[release])
    found = contacts_hold(str(root / "bin" / "python"))
    assert releases.minor(found["version"]) == release
    assert not found["problems"], f"vllm {found['version']}: " + "; ".join(found["problems"])


# What CI reruns per release. On 0.33 every family is built and CPU-verified by the slow stream (the lab stack runs
# vLLM 0.33's code: tests/test_build_*.py) and on the serving venv by tests/test_serving_stack.py: registry, mrv1,
# mrv2 and FlashInfer's module (the default recipe), moe and runner (a model config), mamba, attention and
# mrv2_spec_decode (a hybrid model), each built, installed in the second serving venv and verified there with no
# compile; so nothing is rerun on 0.33. On 0.34 every path is. flashinfer_attention is left out: its nvcc builds of
# FlashInfer's attention modules alone outlast CI's budget on 2 cores (release_rerun.sh of it passes build and verify
# on both releases, timed in BENCHMARKS.md).
RERUN_IN_CI = {"0.33": (), "0.34": tuple(p for p in RERUN if p != "flashinfer_attention")}


@pytest.mark.serving
@pytest.mark.slow
@pytest.mark.parametrize(("release", "path"), [(r, p) for r in VENVS for p in RERUN_IN_CI[r]])
def test_each_family_builds_and_verifies_on_each_release(release, path, tmp_path, build_cache):
    """scripts/release_rerun.sh's small config of ``path``: build + install + CPU verify, or exit 36 at once on a
    release that lacks the path. The builds share the session's build cache (on 0.33 with what
    tests/test_serving_stack.py's builds compiled in the same venv). A cubin carries its source's path, so the 0.34
    venv's kernels are its own (tests/test_build_cache.py)."""
    root = release_venv(VENVS[release])
    env = clean_env(PY=str(root / "bin" / "python"), OUT=str(tmp_path), BUILD_CACHE=str(build_cache))
    done = subprocess.run(["bash", str(ROOT / "scripts" / "release_rerun.sh"), path], capture_output=True, text=True,
                          cwd=ROOT, timeout=3600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("vllm ")]
    family = families.get(FAMILY_OF.get(path, path))
    if release in family.about.releases:
        assert "| build 0 |" in line and "| verify 0 |" in line, line
    else:
        assert "| build 36 |" in line, line
