"""The wheel as users install it (issue 25): built by scripts/release.sh, installed (not editable) into a venv
outside the checkout, used from a temporary directory. The shipped recipes must come from the installed package:
the default one, a model recipe by name, and a build from a model's config.json.

The venv is uv's, on this interpreter (Python 3.12), with the lab stack's torch, Triton and vLLM visible through
a .pth line (as ``--system-site-packages`` makes a system's visible); the wheel and its own dependencies are
installed into the venv, so its ``kernelcache`` comes first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers.common import clean_env
from helpers.wheel import release, site_packages, uv

from kernelcache.format.archive import read_manifest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
SMALL = ("--arch", "sm_90", "--gpu", "h200", "--path", "registry", "--mode", "cross")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    top = tmp_path_factory.mktemp("wheel")
    _, wheel = release(top / "dist")
    root = top / "venv"
    uv("venv", "-q", "--python", sys.executable, str(root))
    (site_packages(root) / "lab-stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    uv("pip", "install", "-q", "--python", str(root / "bin" / "python"), str(wheel))
    return root


def kernelcache(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([str(venv / "bin" / "kernelcache"), *args], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])
    return done


def built(done: subprocess.CompletedProcess, cwd: Path) -> Path:
    """The one bundle a ``build --json`` wrote (its path as given: relative to where it ran)."""
    [target] = json.loads(done.stdout)
    [bundle] = target["bundles"]
    return cwd / bundle["path"]


def test_the_package_and_its_recipes_come_from_the_venv(venv, tmp_path):
    code = "import kernelcache, kernelcache.plan.recipe as r; print(kernelcache.__file__); print(r.RECIPES)"
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, check=True)
    package, recipes = done.stdout.split()
    assert Path(package).is_relative_to(site_packages(venv)) and Path(recipes).is_relative_to(site_packages(venv))
    listed = json.loads(kernelcache(venv, "recipes", "--json", cwd=tmp_path).stdout)["recipes"]
    assert {r["name"] for r in listed} == {p.stem for p in Path(recipes).rglob("*.toml")}
    assert {"vllm-sampler", "vllm-sampler-mrv1-spec", "qwen3-30b-a3b", "llama-3.1-8b"} <= {r["name"] for r in listed}


def test_the_default_recipe_builds_from_a_temp_dir(venv, build_cache, tmp_path):
    done = kernelcache(venv, "build", *SMALL, "--vocab", "32000", "--max-num-seqs", "4", "-o", "out", "--build-cache",
                       str(build_cache), "--json", cwd=tmp_path)
    bundle = built(done, tmp_path)
    assert bundle == tmp_path / "out" / "vllm-sampler-sm_90-h200.tar.zst"
    manifest = read_manifest(bundle)
    assert manifest.build.plan["source"] == "kernelcache/recipes/vllm-sampler.toml"
    assert [v["size"] for v in manifest.build.plan["vocabs"]] == [32000] and manifest.kernels


def test_a_shipped_model_recipe_builds_by_name(venv, build_cache, tmp_path):
    done = kernelcache(venv, "build", *SMALL, "--recipe", "llama-3.1-8b", "--max-num-seqs", "4", "-o", "out",
                       "--build-cache", str(build_cache), "--json", cwd=tmp_path)
    manifest = read_manifest(built(done, tmp_path))
    assert manifest.build.plan["source"] == "kernelcache/recipes/models/llama-3.1-8b.toml"
    assert manifest.build.plan["model"]["architecture"] == "LlamaForCausalLM" and manifest.kernels


def test_a_model_config_builds(venv, build_cache, tmp_path):
    config = tmp_path / "TinyLlama-1.1B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 2048,
                                  "num_attention_heads": 32, "num_key_value_heads": 4, "torch_dtype": "bfloat16"}))
    done = kernelcache(venv, "build", *SMALL, "--model-config", "TinyLlama-1.1B/config.json", "--max-num-seqs", "4",
                       "-o", "out", "--build-cache", str(build_cache), "--json", cwd=tmp_path)
    bundle = built(done, tmp_path)
    assert bundle.name == "TinyLlama-1.1B-sm_90-h200.tar.zst"
    plan = read_manifest(bundle).build.plan
    assert plan["model"]["vocab_size"] == 32000 and plan["source"] == "kernelcache/recipes/vllm-sampler.toml"
