"""Test helpers for FlashInfer: skip (or fail, in CI) without it, a bundle holding a module, a probe."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelcache import __version__
from kernelcache.bundle.make import make_bundle
from kernelcache.format.fingerprint import local_environment, package_version
from kernelcache.format.manifest import Build, FlashInferModule, Target

from .common import clean_env


def require_flashinfer() -> None:
    """Skip without flashinfer-python and the toolchain; scripts/test.sh makes that a failure."""
    from kernelcache.errors import MissingDependency
    from kernelcache.exercise.flashinfer_sampling import find_toolchain

    try:
        if package_version("flashinfer-python") is None:
            raise MissingDependency("flashinfer-python is not installed (KERNELCACHE_SETUP_FLASHINFER=1 setup.sh)")
        find_toolchain()
    except MissingDependency as exc:
        if os.environ.get("KERNELCACHE_REQUIRE_FLASHINFER") == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def flashinfer_bundle(out: Path, module: FlashInferModule, members: list, arch: str = "sm_90",
                      **module_changes) -> Path:
    """A bundle holding one FlashInfer module and no Triton entries (``module_changes`` edit its record)."""
    module = dataclasses.replace(module, **module_changes)
    build = Build(tool=f"kernelcache {__version__}", mode="cross")
    make_bundle(out, [], Target("cuda", arch), local_environment([arch]), build, flashinfer=((module, members),))
    return out


PROBE = r"""
import ctypes, json, os, sys, time
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # torch is CPU-only here: cudart comes from the toolchain
out = {}
started = time.perf_counter()
import flashinfer.jit.env as jit_env
from flashinfer.jit.core import MissingJITCacheError
from flashinfer.jit.sampling import gen_sampling_module
spec = gen_sampling_module()
out["providers"] = sorted(p.provider_id for p in jit_env.FLASHINFER_AOT_PROVIDERS)
out["artifacts"] = [str(a.path) for a in spec.aot_artifacts]
out["jit_dir"] = str(jit_env.FLASHINFER_JIT_DIR)
try:
    started = time.perf_counter()
    import flashinfer.sampling
    module = flashinfer.sampling.get_sampling_module()
    out["load_seconds"] = time.perf_counter() - started
    out["loaded"] = sorted(name for name in vars(module) if not name.startswith("_"))
except MissingJITCacheError as exc:
    out["error"] = f"MissingJITCacheError: {exc}"
print(json.dumps(out))
"""


def tripwire(directory: Path) -> tuple[Path, Path]:
    """A PATH dir whose ``nvcc`` and ``ninja`` only record that something tried to compile."""
    directory.mkdir(parents=True, exist_ok=True)
    calls = directory / "calls.log"
    for tool in ("nvcc", "ninja"):
        script = directory / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 1\n')
        script.chmod(0o755)
    return directory, calls


def probe(variables: dict[str, str], libcudart: Path, tmp: Path, **extra: str) -> tuple[dict, list[str]]:
    """Run PROBE in a fresh interpreter with ``variables`` (what kernelcache env printed); (result, compiles)."""
    wire, calls = tripwire(tmp / "tripwire")
    env = clean_env(**variables, **extra)
    env["PATH"] = f"{wire}{os.pathsep}/usr/bin{os.pathsep}/bin"
    env.pop("CUDA_HOME", None)
    env.pop("CUDA_PATH", None)
    done = subprocess.run([sys.executable, "-c", PROBE, str(libcudart)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    compiles = calls.read_text().splitlines() if calls.exists() else []
    return json.loads(done.stdout.strip().splitlines()[-1]), compiles
