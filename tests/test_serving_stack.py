"""The serving stack end to end: what a user of `pip install vllm==0.33.0` (Python 3.12) gets.

Two separate serving-stack venvs, both made by scripts/setup.sh with STACK=serving (vLLM 0.33.0's own
dependency set: torch 2.14.0, triton 3.8.0, flashinfer-python 0.7.2.post1):
  KERNELCACHE_SERVING_VENV   builds
  KERNELCACHE_SERVING_VENV2  a plain `pip install vllm==0.33.0` + kernelcache, where bundles are installed
This test process runs on the lab stack (triton 3.6.0): its bundles must be refused in the serving venv.
Without the two venvs these tests skip, except under CI=true or KERNELCACHE_REQUIRE_SERVING=1, where
that is a failure (scripts/test.sh sets them up).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.common import SERVED, clean_env, kc

from kernelcache.format.fingerprint import package_version

# A serving build of one vocab takes 5-11 min on 2 busy cores; pyproject.toml's 900 s per test is too short.
pytestmark = [pytest.mark.serving, pytest.mark.slow, pytest.mark.timeout(3600)]
ARCH, GPU, VOCAB = "sm_90", "h200", "128256"


@dataclass(frozen=True)
class Venv:
    root: Path

    def kernelcache(self, *args: str, cwd: Path | None = None, env: dict | None = None,
                    timeout: int = 1800) -> subprocess.CompletedProcess:
        """Run its CLI in a session of its own: a timed-out test takes the build's nvcc and workers with it."""
        command = [str(self.root / "bin" / "kernelcache"), *args]
        with subprocess.Popen(command, cwd=cwd, env=clean_env(**(env or {})), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) as child:
            try:
                stdout, stderr = child.communicate(timeout=timeout)
            except BaseException:
                os.killpg(child.pid, signal.SIGKILL)
                raise
        return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)

    def version(self, package: str) -> str:
        code = f"import importlib.metadata as m; print(m.version({package!r}))"
        return subprocess.run([str(self.root / "bin" / "python"), "-c", code], capture_output=True, text=True,
                              check=True).stdout.strip()


def serving_venv(variable: str) -> Venv:
    value = os.environ.get(variable)
    if not value or not (Path(value) / "bin" / "kernelcache").is_file():
        message = f"{variable} does not name a serving-stack venv with kernelcache (STACK=serving scripts/setup.sh)"
        if os.environ.get("CI") == "true" or os.environ.get("KERNELCACHE_REQUIRE_SERVING") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return Venv(Path(value))


@pytest.fixture(scope="module")
def builder() -> Venv:
    return serving_venv("KERNELCACHE_SERVING_VENV")


@pytest.fixture(scope="module")
def server() -> Venv:
    venv = serving_venv("KERNELCACHE_SERVING_VENV2")
    assert venv.root != serving_venv("KERNELCACHE_SERVING_VENV").root, "the install side must be its own venv"
    return venv


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def server_fingerprint(server, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fingerprint") / "serving.json"
    path.write_text(ok(server.kernelcache("fingerprint", "--json")).stdout)
    return path


def test_both_venvs_are_vllm_0_33s_own_stack(builder, server):
    for venv in (builder, server):
        assert [venv.version(p) for p in ("vllm", "torch", "triton", "flashinfer-python")] == \
            ["0.33.0", "2.14.0", "3.8.0", "0.7.2.post1"]
        assert subprocess.run([str(venv.root / "bin" / "python"), "-c", "import sys; print(sys.version_info[:2])"],
                              capture_output=True, text=True).stdout.strip() == "(3, 12)"


# -- one vocab of the default recipe with every path (FlashInfer's module included), built in one serving venv and
# installed in the other (the recipe's eight vocabs would take CI's whole time budget; the examples, which build
# less, run verbatim in tests/test_examples_run.py)


@dataclass(frozen=True)
class DefaultBuild:
    bundle: Path  # vllm-sampler-<ARCH>-<GPU>.tar.zst
    cache: Path  # where the second venv installed it
    build: subprocess.CompletedProcess
    install: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def default_build(builder, server, tmp_path_factory, build_cache) -> DefaultBuild:
    """`kernelcache build` of the default recipe for one vocab in the builder venv, with no CUDA toolchain fetched
    yet, run from a directory of its own; `kernelcache install` of its bundle in the second serving venv. It shares
    the session's build cache (tests/conftest.py): FlashInfer's sampling module comes from the lab's build of it
    (the same FlashInfer release, toolchain and arch: buildcache/flashinfer_modules.py module_key), and this venv's
    later builds take the kernels and gcc-built modules it compiled."""
    work = tmp_path_factory.mktemp("default-build")
    (work / "job").mkdir()
    build = ok(builder.kernelcache("build", "--arch", ARCH, "--gpu", GPU, "--vocab", VOCAB, "-o", "bundles",
                                   "--build-cache", str(build_cache),
                                   cwd=work / "job", env={"KERNELCACHE_TOOLCHAIN_DIR": str(work / "toolchains")},
                                   timeout=3000))
    bundle = work / "job" / "bundles" / f"vllm-sampler-{ARCH}-{GPU}.tar.zst"
    install = ok(server.kernelcache("install", str(bundle), "--cache-dir", str(work / "cache")))
    return DefaultBuild(bundle, work / "cache", build, install)


def test_build_fetches_its_toolchain_and_covers_every_path(default_build):
    assert "fetching the CUDA 13.0.88 build toolchain" in default_build.build.stderr
    assert "toolchain ready" in default_build.build.stderr
    manifest = json.loads(kc("inspect", str(default_build.bundle), "--json", check=True).stdout)
    assert manifest["environment"]["triton"] == "3.8.0" and manifest["environment"]["python"] == "cp312"
    assert [m["name"] for m in manifest["flashinfer"]] == ["sampling"]
    paths = {p for cov in manifest["build"]["coverage"].values() for p in cov["by_path"]}
    assert {"registry", "mrv1", "mrv2"} <= paths and len(manifest["kernels"]) > 0


def test_it_installs_in_another_serving_venv_and_verify_sees_no_compile(default_build, server):
    assert re.search(r"installed \d+ entries", default_build.install.stdout), default_build.install.stdout
    verified = ok(server.kernelcache("verify", str(default_build.bundle), "--cache-dir", str(default_build.cache),
                                     timeout=3000))
    assert re.search(r"\b[1-9]\d* hits, 0 compiles, 0 gcc builds,", verified.stdout), verified.stdout


def test_a_process_served_from_it_takes_the_kept_triton_key(default_build, server):
    """Triton 3.8's triton_key(), kept by its install, served by `kernelcache run` in that venv."""
    python = str(server.root / "bin" / "python")
    done = ok(server.kernelcache("run", "--cache-dir", str(default_build.cache), "--", python, "-c", SERVED))
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"seeded": True, "equal": True, "read_libtriton": False}


def test_a_served_process_takes_the_bundles_cuda_utils_for_its_own_install_paths(default_build, server, tmp_path):
    """Triton 3.8 keys cuda_utils by the install paths, so the install venv misses the builder's and would build
    it with gcc (CC=/bin/false here: that fails); under `kernelcache run` the bundle's module is taken."""
    from test_prebuilt_helpers import libcuda_stub, probe

    cache, python = tmp_path / "cache", str(server.root / "bin" / "python")
    ok(server.kernelcache("install", str(default_build.bundle), "--cache-dir", str(cache)))
    stub = libcuda_stub(python, tmp_path / "stub")
    plain = probe(python, cache, stub, served=False)
    assert plain["served"] == [] and "CalledProcessError" in plain["error"]
    assert probe(python, cache, stub, served=True) == {"error": None, "served": [
        "cuda_utils" + server_suffix(server)]}


def server_suffix(server: Venv) -> str:
    code = "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"
    return subprocess.run([str(server.root / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_builder_passes_the_serving_fingerprint_check(builder, server_fingerprint):
    """What `build --target-env` runs before compiling, in the builder venv, for the install venv's file."""
    code = ("import sys; from kernelcache.bundle import target_env as t; from kernelcache.format.manifest import "
            "Target; t.check(t.planned_manifest(Target('cuda', 'sm_90', 32, gpu='h200', sm_count=132), True), "
            "True, t.load(sys.argv[1]), sys.argv[1]); print('accepted')")
    done = subprocess.run([str(builder.root / "bin" / "python"), "-c", code, str(server_fingerprint)],
                          capture_output=True, text=True, env=clean_env())
    assert done.returncode == 0 and done.stdout.strip() == "accepted", done.stderr


# -- refusals: a lab bundle at install, and a lab build for the serving image at build time -------------


def test_lab_bundle_is_refused_in_the_serving_venv(bundle90, server, tmp_path):
    """bundle90: real kernels compiled on this (lab) stack, triton 3.6.0."""
    done = server.kernelcache("install", str(bundle90), "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 20, (done.stdout, done.stderr)
    table = done.stderr.split("fingerprint differences", 1)[1]
    assert re.search(rf"triton\s.*{re.escape(package_version('triton'))}.*3\.8\.0", table), table
    assert "triton_key_sha256" in table
    if sys.version_info[:2] != (3, 12):
        assert "python" in table
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_lab_build_for_the_serving_fingerprint_is_refused_before_compiling(server_fingerprint, tmp_path):
    done = kc("build", "--arch", ARCH, "--gpu", GPU, "--vocab", VOCAB, "--target-env", str(server_fingerprint),
              "-o", str(tmp_path / "out"), "--workdir", str(tmp_path / "work"))
    assert done.returncode == 20, (done.stdout, done.stderr)
    table = done.stderr.split("fingerprint differences", 1)[1]
    assert "triton" in table and "3.8.0" in table
    assert not (tmp_path / "work").exists() and not list((tmp_path / "out").glob("*.tar.zst"))


# -- a model recipe on the serving stack (issue 14) --------------------------------------------------

QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                 "num_experts_per_tok": 8, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}
MODEL_FLAGS = ("--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--max-model-len", "1024")


@pytest.fixture(scope="module")
def model_bundle(builder, tmp_path_factory, build_cache) -> Path:
    """`build --model-config` (a local config.json, Qwen3-30B-A3B's fields) for the fused-MoE layer and
    Model Runner V2's kernels, small serving sizes, in the serving venv (torch 2.14, Triton 3.8)."""
    root = tmp_path_factory.mktemp("model")
    config = root / "Qwen3-30B-A3B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(QWEN3_30B_A3B))
    done = ok(builder.kernelcache("build", "--arch", ARCH, "--gpu", GPU, "--model-config", str(config), "--path", "moe",
                                  "--path", "runner", "--dtype", "bfloat16", *MODEL_FLAGS, "--mode", "cross",
                                  "--build-cache", str(build_cache), "-o", str(root / "out"), "--json", timeout=3000))
    return Path(json.loads(done.stdout)[0]["bundles"][0]["path"])


def test_model_config_builds_moe_and_runner_on_the_serving_stack(model_bundle):
    assert model_bundle.name == f"Qwen3-30B-A3B-{ARCH}-{GPU}.tar.zst"
    manifest = json.loads(kc("inspect", str(model_bundle), "--json", check=True).stdout)
    assert manifest["environment"]["triton"] == "3.8.0"
    plan = manifest["build"]["plan"]
    assert plan["model"]["num_experts"] == 128 and plan["max_num_batched_tokens"] == 64
    coverage = manifest["build"]["coverage"]
    assert set(coverage["fused_moe_kernel"]["by_path"]) == {"moe"}
    assert any("runner" in c["by_path"] for name, c in coverage.items() if name != "fused_moe_kernel")


def test_model_bundle_installs_in_another_serving_venv_and_verify_sees_no_compile(model_bundle, server, tmp_path):
    cache = tmp_path / "cache"
    ok(server.kernelcache("install", str(model_bundle), "--cache-dir", str(cache)))
    verified = ok(server.kernelcache("verify", str(model_bundle), "--cache-dir", str(cache), timeout=3000))
    assert re.search(r"\b[1-9]\d* hits, 0 compiles,", verified.stdout), verified.stdout


# A hybrid model (Nemotron-H-8B's fields) served with Triton attention and one EAGLE draft: the mamba,
# attention and mrv2_spec_decode families on the serving stack's Triton 3.8.
NEMOTRON_H_8B = {"architectures": ["NemotronHForCausalLM"], "vocab_size": 131072, "hidden_size": 4096,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128,
                 "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
                 "torch_dtype": "bfloat16"}
HYBRID_PATHS = ("mamba", "attention", "mrv2_spec_decode")


@pytest.fixture(scope="module")
def hybrid_bundle(builder, tmp_path_factory, build_cache) -> Path:
    root = tmp_path_factory.mktemp("hybrid")
    config = root / "Nemotron-H-8B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(NEMOTRON_H_8B))
    paths = [arg for path in HYBRID_PATHS for arg in ("--path", path)]
    done = ok(builder.kernelcache("build", "--arch", ARCH, "--gpu", GPU, "--model-config", str(config), *paths,
                                  "--attention-backend", "TRITON_ATTN", "--num-speculative-tokens", "1",
                                  "--dtype", "bfloat16", *MODEL_FLAGS, "--mode", "cross", "--build-cache",
                                  str(build_cache), "-o", str(root / "out"), "--json", timeout=3000))
    return Path(json.loads(done.stdout)[0]["bundles"][0]["path"])


def test_a_hybrid_model_builds_mamba_attention_and_mrv2_spec_decode_on_the_serving_stack(hybrid_bundle):
    manifest = json.loads(kc("inspect", str(hybrid_bundle), "--json", check=True).stdout)
    assert manifest["environment"]["triton"] == "3.8.0"
    coverage = manifest["build"]["coverage"]
    built = {path for c in coverage.values() for path in c["by_path"]}
    assert built == set(HYBRID_PATHS), built
    assert {"_chunk_scan_fwd_kernel", "kernel_unified_attention", "_rejection_kernel"} <= set(coverage)


def test_hybrid_bundle_installs_in_another_serving_venv_and_verify_sees_no_compile(hybrid_bundle, server,
                                                                                    tmp_path):
    cache = tmp_path / "cache"
    ok(server.kernelcache("install", str(hybrid_bundle), "--cache-dir", str(cache)))
    verified = ok(server.kernelcache("verify", str(hybrid_bundle), "--cache-dir", str(cache), timeout=3000))
    assert re.search(r"\b[1-9]\d* hits, 0 compiles,", verified.stdout), verified.stdout
