"""`kernelcache fingerprint`, `build --target-env` (refuse before compiling what install would refuse there),
and the build's own provisioning of FlashInfer's CUDA toolchain (found, fetched, or a one-line exit 33)."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
from helpers.common import kc

from kernelcache.bundle import target_env
from kernelcache.exercise import flashinfer_sampling
from kernelcache.format.fingerprint import local_environment, python_tag
from kernelcache.format.manifest import Target
from kernelcache.plan.gpus import PROFILES

vllm_installed = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                    reason="needs vLLM 0.33 (scripts/setup.sh installs it)")


def fingerprint_file(tmp_path: Path, **environment) -> Path:
    """This environment's fingerprint file, with some environment fields changed."""
    done = kc("fingerprint", "--json", "--arch", "sm_90", check=True)
    data = json.loads(done.stdout)
    data["environment"].update(environment)
    path = tmp_path / "fingerprint.json"
    path.write_text(json.dumps(data))
    return path


def test_fingerprint_json_is_this_environment():
    data = json.loads(kc("fingerprint", "--json", check=True).stdout)
    here = local_environment(["sm_90"])
    assert data["schema"] == target_env.SCHEMA
    env = data["environment"]
    assert env["python"] == python_tag() and env["triton"] == here.triton
    assert env["triton_key_sha256"] == here.triton_key_sha256
    assert env["ptxas"]["sm_90"] == here.ptxas["sm_90"]
    assert set(env["ptxas"]) >= {p.arch for p in PROFILES.values()}  # one file serves any target
    assert env["vllm"] == here.vllm and env["flashinfer"] == here.flashinfer
    assert data["torch_cuda"] == target_env.torch_cuda()
    assert target_env.Fingerprint.from_dict(data).to_dict() == data


def test_fingerprint_text_names_every_field():
    text = kc("fingerprint", check=True).stdout
    for field in ("python", "triton_key sha256", "ptxas[sm_90]", "env vars", "vllm", "flashinfer", "CUDA toolkit",
                  "GPUs"):
        assert field in text
    assert python_tag() in text


def test_fingerprint_records_set_cache_invalidating_vars():
    done = kc("fingerprint", "--json", "--arch", "sm_90", env={"TRITON_DEFAULT_FP_FUSION": "1"}, check=True)
    assert set(json.loads(done.stdout)["environment"]["env_vars"]) == {"TRITON_DEFAULT_FP_FUSION"}


def test_same_environment_passes_the_check():
    here = target_env.take(["sm_90"])
    planned = target_env.planned_manifest(Target("cuda", "sm_90", 32, gpu="h200", sm_count=132), flashinfer=True)
    target_env.check(planned, True, here, "here")  # no raise
    assert not [d for d in target_env.differences(planned, True, here) if d.blocking]


@vllm_installed
def test_build_target_env_refuses_before_compiling(tmp_path):
    other = fingerprint_file(tmp_path, python="cp399", triton="9.9.9")
    started = time.monotonic()
    done = kc("build", "--arch", "sm_90", "--gpu", "h200", "--vocab", "128256", "--target-env", str(other),
              "-o", str(tmp_path / "out"), "--workdir", str(tmp_path / "work"))
    assert done.returncode == 20, done.stderr
    assert "would be refused in the environment of" in done.stderr and "nothing was compiled" in done.stderr
    table = done.stderr.split("fingerprint differences", 1)[1]
    assert "python" in table and "cp399" in table and python_tag() in table and "9.9.9" in table
    assert not list((tmp_path / "out").glob("*.tar.zst")) and not (tmp_path / "work").exists()
    assert time.monotonic() - started < 120  # imports only; a build of one vocab takes minutes here


@vllm_installed
def test_build_target_env_names_a_gpu_of_another_arch(tmp_path):
    path = fingerprint_file(tmp_path)
    data = json.loads(path.read_text())
    data["gpus"] = [{"index": 0, "name": "NVIDIA B200", "capability": 100, "sm_count": 148}]
    path.write_text(json.dumps(data))
    done = kc("build", "--arch", "sm_90", "--gpu", "h200", "--path", "registry", "--target-env", str(path),
              "-o", str(tmp_path / "out"))
    assert done.returncode == 21, done.stderr
    assert "gpu[0].arch" in done.stderr and "sm_100" in done.stderr


@pytest.mark.parametrize("content", ["not json", json.dumps({"schema": "other"}),
                                     json.dumps({"schema": target_env.SCHEMA})])
def test_bad_fingerprint_file_is_a_usage_error(tmp_path, content):
    path = tmp_path / "fp.json"
    path.write_text(content)
    done = kc("build", "--arch", "sm_90", "--target-env", str(path), "-o", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "fingerprint" in done.stderr


# -- the FlashInfer toolchain: provisioned by the build, or a one-line error ----------------------


def no_toolkit_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment with no toolchain of ours, no CUDA on PATH, and pip pointed at an index that is down."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if not (Path(p) / "nvcc").exists())
    return {"KERNELCACHE_TOOLCHAIN_DIR": str(tmp_path / "toolchains"), "PATH": path, "PIP_CONFIG_FILE": os.devnull,
            "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "", "PIP_RETRIES": "0",
            "PIP_TIMEOUT": "2", "PIP_NO_CACHE_DIR": "1", **extra}


@vllm_installed
@pytest.mark.flashinfer
def test_build_without_network_fails_in_one_line_before_compiling(tmp_path):
    pytest.importorskip("flashinfer")
    started = time.monotonic()
    done = kc("build", "--arch", "sm_90", "--gpu", "h200", "--vocab", "128256", "-o", str(tmp_path / "out"),
              "--workdir", str(tmp_path / "work"), env=no_toolkit_env(tmp_path))
    assert done.returncode == 33, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("kernelcache: error:")]
    assert len(errors) == 1 and "pip could not fetch the CUDA 13.0.88 toolchain" in errors[0]
    assert "fetching the CUDA 13.0.88 build toolchain" in done.stderr  # the progress line came first
    assert not (tmp_path / "work").exists() and not list((tmp_path / "out").glob("*"))
    assert not list((tmp_path / "toolchains").glob("cuda-*"))  # nothing half-installed
    assert time.monotonic() - started < 120


@vllm_installed
@pytest.mark.flashinfer
def test_build_without_disk_for_the_toolchain_fails_in_one_line(tmp_path):
    pytest.importorskip("flashinfer")
    blocker = tmp_path / "file"
    blocker.write_text("a file where the toolchain dir should go")
    done = kc("build", "--arch", "sm_90", "--path", "flashinfer", "-o", str(tmp_path / "out"),
              env=no_toolkit_env(tmp_path, KERNELCACHE_TOOLCHAIN_DIR=str(blocker / "toolchains")))
    assert done.returncode == 33, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("kernelcache: error: cannot create the CUDA toolchain dir")


@pytest.mark.flashinfer
def test_a_cuda_toolkit_already_here_is_used_without_fetching(tmp_path, monkeypatch):
    try:
        ours = flashinfer_sampling.find_toolchain()
    except flashinfer_sampling.MissingDependency:
        pytest.skip("the pip CUDA toolchain is not set up (scripts/setup.sh)")
    monkeypatch.setenv("KERNELCACHE_TOOLCHAIN_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(ours.root))
    monkeypatch.setenv("PATH", os.pathsep.join([str(ours.ninja_dir), os.environ.get("PATH", "")]))
    said: list[str] = []
    tools = flashinfer_sampling.ensure_toolchain(say=said.append)
    assert tools.root == ours.root and tools.cuda == flashinfer_sampling.CUDA_VERSION
    assert said == [f"using the CUDA {tools.cuda} toolkit in {ours.root} to build FlashInfer's sampling module"]
    assert not (tmp_path / "empty").exists()


@pytest.mark.flashinfer
def test_the_toolchain_is_fetched_once_with_progress_then_reused(tmp_path, monkeypatch):
    """A real pip install of the pinned CUDA wheels (from pip's cache after the first time)."""
    monkeypatch.setenv("KERNELCACHE_TOOLCHAIN_DIR", str(tmp_path / "toolchains"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", no_toolkit_env(tmp_path)["PATH"])
    said: list[str] = []
    tools = flashinfer_sampling.ensure_toolchain(say=said.append)
    assert tools.cuda == flashinfer_sampling.CUDA_VERSION and (tools.root / "bin" / "nvcc").is_file()
    assert said[0].startswith("fetching the CUDA 13.0.88 build toolchain") and said[-1].startswith("CUDA 13.0.88")
    assert any("nvidia-cuda-nvcc" in line or "nvidia_cuda_nvcc" in line for line in said[1:-1])
    again: list[str] = []
    assert flashinfer_sampling.ensure_toolchain(say=again.append) == tools and again == []

