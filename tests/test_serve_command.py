"""The serve command as the plan: vLLM's own parser and config, the bundle's record of it, and ``run``'s comparison.

Configurations come from the installed vLLM (a child process behind the fake target for each GPU profile), with
model directories that hold only a config.json (tests/data/models/). The build and install of the ``run`` tests
are real (one small bundle, the MRV2 Gumbel kernel for one dtype); the server ``run`` starts is a stand-in
executable named ``vllm`` that prints its arguments (no GPU here).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from helpers.common import ROOT, kc
from helpers.serve_child import KeptChild

from kernelcache.errors import RecipeError, UsageError
from kernelcache.plan.recipe import PlanOverrides
from kernelcache.plan.serve import ServeCommand, ServeConfig, shorthand_words
from kernelcache.runtime.match import differences

MODELS = ROOT / "tests" / "data" / "models"
TINY = MODELS / "tiny-llama"
MISTRAL = MODELS / "Mistral-7B-Instruct-v0.3"


def served(arch: str = "sm_90", gpus=("h100-sxm",), recipe=None, **given):
    from kernelcache.build import planned

    return planned(arch, recipe, PlanOverrides(gpus=gpus, **given))


# -- parsing the command (no vLLM) --------------------------------------------------------------------------


def test_a_serve_command_is_read_as_its_words():
    command = ServeCommand.parse("vllm serve Qwen/Qwen3-8B --max-model-len 32768 --block-size=32")
    assert command.model == "Qwen/Qwen3-8B"
    assert command.value("--max-model-len") == "32768" and command.value("--block-size") == "32"
    assert command.with_model("/m/Qwen3-8B").args[0] == "/m/Qwen3-8B"
    assert ServeCommand.parse(["/usr/bin/vllm", "serve", "--model", "x"]).model == "x"
    assert ServeCommand.parse(command.text) == command


@pytest.mark.parametrize("text", ["python -m vllm serve x", "vllm run x", "vllm serve", "vllm serve --port 8000"])
def test_what_is_not_a_serve_command_with_a_model_is_a_usage_error(text):
    with pytest.raises(UsageError):
        ServeCommand.parse(text)


def test_kernelcache_flags_are_a_shorthand_for_vllm_flags():
    words = shorthand_words({"max_num_seqs": 8, "block_size": 32, "num_speculative_tokens": 2})
    assert words[:4] == ("--max-num-seqs", "8", "--block-size", "32")
    assert json.loads(words[5]) == {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}


def test_a_serve_config_round_trips_through_json():
    config = ServeConfig("vllm serve m", "0.33.0", "abc", "LlamaForCausalLM", "bfloat16", 1024, 4096, 8, 8192, 16,
                         "auto", 1, "FLASH_ATTN", cudagraph_capture_sizes=(1, 2, 4))
    assert ServeConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_a_model_folder_without_config_json_is_named(tmp_path):
    with pytest.raises(RecipeError, match="has no config.json"):
        served(serve=f"vllm serve {tmp_path}")
    with pytest.raises(RecipeError, match="no config for it"):
        served(serve="vllm serve some-org/unknown-model")


def test_profiles_vllm_configures_differently_are_built_separately():
    from kernelcache.build import _agreed

    one = ServeConfig("c", "0.33.0", "h1", "A", "bfloat16", 1024, 4096, 1024, 8192, 16, "auto", 1, "FLASH_ATTN")
    other = ServeConfig(**{**one.to_dict(), "max_num_seqs": 256, "config_hash": "h2"})
    assert _agreed({"h100-sxm": one, "h200": one}) == one
    with pytest.raises(UsageError, match="max_num_seqs 1024 vs 256"):
        _agreed({"h100-sxm": one, "l4": other})


# -- what vLLM configures ------------------------------------------------------------------------------------

vllm_needed = pytest.mark.vllm


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """One configuring child for the module's commands (helpers/serve_child.py): vLLM imported once."""
    pytest.importorskip("vllm")
    child = KeptChild(tmp_path_factory.mktemp("kept-child"))
    yield child
    child.close()


@pytest.fixture
def one_child(kept, monkeypatch):
    """The commands a test configures are answered by the module's kept child, as a fresh child answers them."""
    from kernelcache.exercise import vllm_serve

    monkeypatch.setattr(vllm_serve, "_run_child", kept.run)
    return kept


@vllm_needed
def test_vllm_configures_the_plan_from_the_command(one_child):
    pytest.importorskip("vllm")
    plan = served(serve=f"vllm serve {TINY} --max-num-seqs 8 --block-size 32")
    record = plan.serve
    assert record["command"] == f"vllm serve {TINY} --max-num-seqs 8 --block-size 32"
    assert record["vllm"] and len(record["config_hash"]) >= 8
    # vLLM's values, not kernelcache's defaults: the model's 4096 positions, the flags given, FLASH_ATTN on Hopper.
    assert (plan.max_model_len, plan.max_num_seqs, plan.block_size) == (4096, 8, 32)
    assert plan.attention_backend == "FLASH_ATTN" and "attention" not in plan.paths
    # no recipe: every family the model needs on this server (a dense model: the sampler paths and the runner)
    assert set(plan.paths) == {"registry", "mrv1", "mrv2", "flashinfer", "runner"}
    assert plan.vocabs[0].size == 1024 and plan.dtypes == ("float32", "bfloat16")
    assert plan.to_dict()["serve"] == record  # the bundle's plan carries it


@vllm_needed
def test_a_first_serve_build_imports_vllm_in_one_child(tmp_path, monkeypatch):
    """The child that configures the serve command imports what the preflight's import row would; the preflight
    then starts no child of its own. A second build takes the kept answer and the kept pass: no child at all."""
    pytest.importorskip("vllm")
    from kernelcache.preflight import preflight

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no kept answer, no remembered pass
    command = f"vllm serve {TINY} --max-num-seqs 8"
    plan = served(serve=command)
    assert "flashinfer" in plan.paths  # the row imports vLLM and FlashInfer
    checked = preflight(plan, ())
    assert "imports" in checked.remembered and "imports" not in checked.ran
    assert served(serve=command) == plan


@vllm_needed
def test_an_import_that_kills_the_configuring_child_leaves_its_answer_and_the_check_to_the_preflight(
        tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from kernelcache.exercise.vllm_serve import resolve
    from kernelcache.plan.gpus import profile

    site = tmp_path / "site"
    site.mkdir()
    # a module that ends its process as a crash in an extension module does (vLLM imports FlashInfer itself while
    # configuring, so a FlashInfer that crashes fails the configuration, as before)
    (site / "crashing_stub.py").write_text("import os\nos._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{ROOT}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    found = resolve(ServeCommand((str(TINY),)), (profile("h100-sxm"),), imports=("vllm", "crashing_stub"))
    assert found.configs["h100-sxm"].max_model_len == 4096 and found.imported == ("vllm",)


@vllm_needed
def test_max_model_len_is_the_models_and_the_shorthand_yields_the_same_config(one_child):
    pytest.importorskip("vllm")
    shorthand = served(model_config=str(MISTRAL / "config.json"), max_num_seqs=8)
    command = served(serve=f"vllm serve {MISTRAL} --max-num-seqs 8")
    assert shorthand.max_model_len == 32768  # Mistral-7B's, where kernelcache's own default was 8192
    assert shorthand.serve["config_hash"] == command.serve["config_hash"]
    assert shorthand.to_dict() | {"serve": None} == command.to_dict() | {"serve": None}


@vllm_needed
def test_a_hub_id_takes_its_config_and_keeps_its_name_in_the_hash(tmp_path, one_child):
    pytest.importorskip("vllm")
    hub = served(serve="vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 8")  # the config kernelcache ships
    assert hub.max_model_len == 131072 and hub.vocabs[0].size == 128256
    assert hub.name == "Llama-3.1-8B-Instruct" and hub.serve["command"].startswith("vllm serve meta-llama/")
    folder = tmp_path / "Llama-3.1-8B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_bytes(
        (ROOT / "kernelcache/recipes/models/configs/meta-llama--Llama-3.1-8B-Instruct.json").read_bytes())
    local = served(serve=f"vllm serve {folder} --max-num-seqs 8")
    assert local.serve["config_hash"] != hub.serve["config_hash"]  # vLLM hashes the model string the server has
    assert local.to_dict() | {"serve": None, "source": ""} == hub.to_dict() | {"serve": None, "source": ""}


@vllm_needed
def test_non_default_flags_reach_the_plan_and_the_families(one_child):
    pytest.importorskip("vllm")
    plan = served(serve=f"vllm serve {TINY} --max-num-seqs 8 --max-model-len 2048 --attention-backend TRITON_ATTN "
                        "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 2, "
                        "\"prompt_lookup_max\": 3}'")
    assert (plan.max_model_len, plan.num_speculative_tokens, plan.attention_backend) == (2048, 2, "TRITON_ATTN")
    assert {"attention", "mrv1_spec_decode", "mrv2_spec_decode"} <= set(plan.paths)  # Triton attention, drafts
    assert plan.serve["speculative_method"] == "ngram"


@vllm_needed
def test_a_recipe_names_its_serve_command(tmp_path, one_child):
    pytest.importorskip("vllm")
    (tmp_path / "tiny.json").write_bytes((TINY / "config.json").read_bytes())
    recipe = tmp_path / "tiny.toml"
    recipe.write_text('name = "tiny"\ngpus = ["h100-sxm", "h200"]\nserve = "vllm serve org/tiny --max-num-seqs 8"\n'
                      'model_config = "tiny.json"\n[vllm]\npaths = ["mrv2"]\n')
    plan = served(recipe=str(recipe), gpus=None)
    assert plan.paths == ("mrv2",) and plan.max_num_seqs == 8 and plan.max_model_len == 4096
    assert plan.serve["command"] == "vllm serve org/tiny --max-num-seqs 8"
    # the command line's flags come after the recipe's: vLLM takes the last value
    assert served(recipe=str(recipe), gpus=None, max_num_seqs=4).max_num_seqs == 4


@vllm_needed
def test_bad_serve_commands_are_refused_with_vllms_word_and_their_own_codes(tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "out"
    rejected = kc("build", "--arch", "sm_90", "--gpu", "h100-sxm", "-o", str(out), "--", "vllm", "serve", str(TINY),
                  "--max-num-seqz", "3")
    assert rejected.returncode == 2 and "unrecognized arguments: --max-num-seqz" in rejected.stderr
    foobar = tmp_path / "foobar"
    foobar.mkdir()
    config = json.loads((TINY / "config.json").read_text()) | {"architectures": ["FooBarForCausalLM"]}
    (foobar / "config.json").write_text(json.dumps(config))
    unknown = kc("build", "--arch", "sm_90", "--gpu", "h100-sxm", "-o", str(out), "--", "vllm", "serve", str(foobar))
    assert unknown.returncode == 37, unknown.stderr
    assert "FooBarForCausalLM" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    assert not out.exists()  # nothing written


# -- the bundle's record and run's comparison -----------------------------------------------------------------


def record(command: str, **derived) -> dict:
    base = {"command": command, "max_model_len": 4096, "max_num_seqs": 1024, "max_num_batched_tokens": 8192,
            "block_size": 16, "kv_cache_dtype": "auto", "attention_backend": "FLASH_ATTN", "tensor_parallel_size": 1,
            "dtype": "bfloat16", "gdn_prefill_backend": "auto", "num_speculative_tokens": 0, "speculative_method": ""}
    return base | derived


@pytest.mark.parametrize(("run", "said"), [
    ("vllm serve m", []),
    ("vllm serve m --max-num-seqs 1024 --dtype auto -tp 1", []),  # vLLM's derived values for the bundle
    ("vllm serve m --max-num-seqs 256", ["--max-num-seqs 256: the bundle was built for 1024"]),
    ("vllm serve other", ["model other: the bundle was built for m"]),
    ("vllm serve m --block-size 32 --tensor-parallel-size 2",
     ["--block-size 32: the bundle was built for 16", "--tensor-parallel-size 2: the bundle was built for 1"]),
    ("vllm serve m --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 2}'",
     ["--speculative-config with 2 draft token(s): the bundle was built for 0"]),
])
def test_run_names_each_flag_that_changes_keys(run, said):
    assert differences(record("vllm serve m"), ServeCommand.parse(run)) == said


def test_a_flag_the_bundle_set_and_the_server_leaves_out_is_named():
    found = differences(record("vllm serve m --max-model-len 2048", max_model_len=2048), ServeCommand.parse(
        "vllm serve m"))
    assert found == ["--max-model-len not given: the bundle was built with --max-model-len 2048 (vLLM's default "
                     "may differ)"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A real bundle built from a serve command, installed; and a bin dir whose ``vllm`` prints its arguments."""
    pytest.importorskip("vllm")
    work = tmp_path_factory.mktemp("served")
    kc("build", "--arch", "sm_90", "--gpu", "h100-sxm", "--path", "mrv2", "--dtype", "bfloat16", "-o",
       str(work / "out"), "--", "vllm", "serve", str(TINY), "--max-num-seqs", "16", check=True, timeout=1200)
    bundle = next((work / "out").glob("*.tar.zst"))
    kc("install", str(bundle), "--cache-dir", str(work / "cache"), check=True)
    bin_dir = work / "bin"
    bin_dir.mkdir()
    server = bin_dir / "vllm"
    server.write_text("#!/bin/sh\necho \"served: $*\"\n")
    server.chmod(server.stat().st_mode | stat.S_IEXEC)
    return bundle, work / "cache", bin_dir


def run_served(installed, *flags: str, strict: bool = False) -> subprocess.CompletedProcess:
    bundle, cache, bin_dir = installed
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return kc("run", "--cache-dir", str(cache), *(["--strict"] if strict else []), "--", "vllm", "serve", str(TINY),
              *flags, env=env)


@vllm_needed
def test_inspect_and_ls_say_what_the_bundle_was_built_for(installed):
    bundle, cache, _ = installed
    line = f"vllm serve {TINY} --max-num-seqs 16"
    assert f"built for: {line} (vLLM config hash " in kc("inspect", str(bundle), check=True).stdout
    assert f"built for {line}" in kc("ls", "--cache-dir", str(cache), check=True).stdout
    listing = json.loads(kc("ls", "--cache-dir", str(cache), "--json", check=True).stdout)
    assert listing["bundles"][0]["serve"] == line and listing["bundles"][0]["config_hash"]


@vllm_needed
def test_run_starts_the_matching_command_and_warns_on_a_different_one(installed):
    same = run_served(installed, "--max-num-seqs", "16")
    assert same.returncode == 0 and same.stdout.startswith("served: serve") and "warning" not in same.stderr
    other = run_served(installed, "--max-num-seqs", "64")
    assert other.returncode == 0 and "served: serve" in other.stdout
    assert "--max-num-seqs 64: the bundle was built for 16" in other.stderr


@vllm_needed
def test_run_strict_refuses_a_different_command_before_the_server_starts(installed):
    refused = run_served(installed, "--max-num-seqs", "64", strict=True)
    assert refused.returncode == 22 and "--max-num-seqs 64" in refused.stderr
    assert "served:" not in refused.stdout
    assert run_served(installed, "--max-num-seqs", "16", strict=True).returncode == 0


def test_bundles_without_a_serve_command_are_not_compared(small_bundle, tmp_path):
    cache = tmp_path / "cache"
    kc("install", str(small_bundle), "--cache-dir", str(cache), check=True)
    done = kc("run", "--strict", "--cache-dir", str(cache), "--", "sh", "-c", "echo ok", "vllm", "serve", "m")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def with_plan(bundle, out, plan: dict):
    """The same bundle under a manifest whose build plan is ``plan``."""
    import dataclasses

    from kernelcache.format import archive

    manifest = archive.read_manifest(bundle)
    manifest = dataclasses.replace(manifest, build=dataclasses.replace(manifest.build, plan=plan))
    data = {name: blob for _, name, blob in archive.iter_members(bundle)}
    return archive.write(out, manifest, [(name, lambda blob=blob: blob) for name, blob in data.items()])


def test_ls_inspect_and_run_read_a_bundles_serve_record_alike(small_bundle, tmp_path):
    from kernelcache.manage import ls
    from kernelcache.runtime.match import built_for

    served = record("vllm serve m --max-num-seqs 1024") | {"config_hash": "abc123"}
    good = with_plan(small_bundle, tmp_path / "good.tar.zst", {"name": "good", "serve": served})
    odd = with_plan(small_bundle, tmp_path / "odd.tar.zst", {"name": "odd", "serve": "vllm serve m"})
    for bundle, cache, expected in ((good, tmp_path / "c1", served), (odd, tmp_path / "c2", None)):
        kc("install", str(bundle), "--cache-dir", str(cache), "--no-gpu-check", check=True)
        [listed] = ls(cache).bundles
        shown = kc("inspect", str(bundle), check=True).stdout
        assert built_for(cache) == ([expected] if expected else [])  # run's comparison reads this
        assert (listed.serve, listed.config_hash) == ((expected["command"], "abc123") if expected else ("", ""))
        assert ("built for: vllm serve m --max-num-seqs 1024 (vLLM config hash abc123)" in shown) == bool(expected)
