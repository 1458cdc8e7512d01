"""vLLM's own AOT compile of a tiny Llama on this CPU-only machine (scripts/gpu/engine_compile_states.py build, on the
fake sm_90 target): the artifact vLLM saves loads in a fresh process, its cache relocated under a fresh HOME, through
vLLM's own load path with VLLM_FORCE_AOT_LOAD=1 (no Dynamo trace, no compile); a changed hashed VLLM_* variable
moves vLLM's cache directory, and the forced load then fails instead of compiling."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.stacks import STACKS, stack

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "gpu" / "engine_compile_states.py")
MODEL = ROOT / "scripts" / "gpu" / "models" / "llama-tiny"


def _state(python, work: Path, name: str, cache_root: Path, **env: str) -> dict:
    home = work / f"home-{name}"
    home.mkdir(parents=True, exist_ok=True)
    out = work / f"{name}.json"
    done = python.run(SCRIPT, "build", "--model", str(work / "model"), "--out", str(out),
               env={"PYTHONPATH": str(ROOT), "HOME": str(home), "VLLM_CACHE_ROOT": str(cache_root), **env},
               timeout=1500)
    assert out.exists(), (name, done.returncode, done.stderr[-3000:])
    return json.loads(out.read_text())


@pytest.mark.parametrize("stack_name", STACKS)
def test_a_cpu_built_aot_artifact_loads_relocated_through_vllms_own_path(stack_name, tmp_path):
    python = stack(stack_name)
    pytest.importorskip("vllm")
    (tmp_path / "model").mkdir()
    shutil.copy(MODEL / "config.json", tmp_path / "model" / "config.json")  # one model path: it is in the hash
    made = python.run("-c", "import sys; from kernelcache.exercise.fake_cuda_runtime import build_cudart_shim; "
                      "print(build_cudart_shim(sys.argv[1]))", str(tmp_path / "shim"), env={"PYTHONPATH": str(ROOT)})
    assert made.returncode == 0, made.stderr[-2000:]
    preload = {"LD_PRELOAD": made.stdout.strip()}

    built = _state(python, tmp_path, "build", tmp_path / "built", **preload)
    assert built["ok"], built.get("error")
    assert built["vllm_counters"]["num_aot_compiles"] == 1 and built["dynamo_stats"]["unique_graphs"] == 1
    assert built["events"].get("triton_compile", 0) > 0  # Inductor's kernels, compiled for sm_90

    shutil.copytree(tmp_path / "built", tmp_path / "elsewhere" / "root", symlinks=True)
    loaded = _state(python, tmp_path, "load", tmp_path / "elsewhere" / "root", VLLM_FORCE_AOT_LOAD="1", **preload)
    assert loaded["factors"] == built["factors"]
    counters = loaded["vllm_counters"]
    assert counters.get("num_aot_artifacts_loaded") == 1, loaded.get("after_save")
    assert "num_aot_compiles" not in counters and "num_inductor_compiles" not in counters
    assert "unique_graphs" not in loaded["dynamo_stats"]
    assert "triton_compile" not in loaded["events"] and "gcc_build" not in loaded["events"]

    changed = _state(python, tmp_path, "changed", tmp_path / "elsewhere" / "root", VLLM_FORCE_AOT_LOAD="1",
                     VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE="0", **preload)
    assert changed["factors"][0] != built["factors"][0]  # the env hash of envs.compile_factors()
    assert "num_aot_artifacts_loaded" not in changed["vllm_counters"]
    assert "num_aot_compiles" not in changed["vllm_counters"]  # the forced load failed; nothing compiled
    assert "No such file" in changed.get("after_save", "")
