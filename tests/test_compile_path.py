"""The compile path (issue 39): ``kernelcache build --path compile -- vllm serve MODEL ...`` runs vLLM's own
torch.compile of a tiny Llama on the fake sm_90 target and bundles what vLLM saved; ``install`` into a fresh cache
under a fresh HOME places it where ``kernelcache env`` points ``VLLM_CACHE_ROOT``, and a fresh process loads it
through vLLM's own load path (``_try_load_aot_compiled_fn``, ``VLLM_FORCE_AOT_LOAD=1``) with no Dynamo trace and
no compile. A changed hashed ``VLLM_*`` variable, or a served command whose config differs, is refused at install
(exit 23) with the factor named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.stacks import stack

from kernelcache.plan.serve import ServeCommand

# The serving stack only (the CI check, its mega artifact): the lab stack's build and relocated load are
# tests/test_engine_compile.py's, and each case costs minutes of CI.
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.serving]
ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "scripts" / "gpu" / "models" / "llama-tiny"
FLAGS = ("--attention-backend", "TRITON_ATTN", "--max-model-len", "2048", "--max-num-batched-tokens", "2048",
         "--max-num-seqs", "64")


def _load(python, model: Path, variables: dict, work: Path) -> dict:
    """vLLM's forward on the fake target in a fresh process, with ``kernelcache env``'s variables: a load."""
    from kernelcache.exercise.fake_cuda_runtime import SHIM_NAME

    answer = work / "load.json"
    request = {"mode": "build", "args": [str(model), *FLAGS], "shown": ServeCommand((str(model), *FLAGS)).text,
               "profile": {"name": "h100-sxm", "arch": "sm_90", "product": "NVIDIA H100 80GB HBM3", "sm_count": 132,
                           "memory_mib": 81559}, "answer": str(answer)}
    (work / "load-request.json").write_text(json.dumps(request))
    made = python.run("-c", "import sys; from kernelcache.exercise.fake_cuda_runtime import build_cudart_shim; "
                      "print(build_cudart_shim(sys.argv[1]))", str(work / "shim"), env={"PYTHONPATH": str(ROOT)})
    assert made.returncode == 0, made.stderr[-2000:]
    assert made.stdout.strip().endswith(SHIM_NAME)
    done = python.run("-m", "kernelcache.exercise.vllm_compile", str(work / "load-request.json"),
                      env={"PYTHONPATH": str(ROOT), "HOME": str(work / "home-load"), "LD_PRELOAD": made.stdout.strip(),
                           "CUDA_VISIBLE_DEVICES": "", "KERNELCACHE_TARGET_MODE": "cross", **variables}, timeout=1500)
    assert answer.exists(), (done.returncode, done.stderr[-3000:])
    return json.loads(answer.read_text())


def test_a_cpu_built_compile_artifact_installs_relocated_and_loads_through_vllm(tmp_path):
    python = stack("serving")
    model = tmp_path / "models" / "llama-tiny"  # the same path built and served: vLLM hashes the model string
    model.mkdir(parents=True)
    shutil.copy(MODEL / "config.json", model / "config.json")
    env = {"PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "home-build")}
    python.kc("build", "--arch", "sm_90", "--gpu", "h100-sxm", "--mode", "cross", "--path", "compile", "-o",
              str(tmp_path / "out"), "--", "vllm", "serve", str(model), *FLAGS, env=env, check=True, timeout=1500)
    bundle = next((tmp_path / "out").glob("*.tar.zst"))
    shown = json.loads(python.kc("inspect", str(bundle), "--json", env=env, check=True).stdout)
    skipped = {s["path"] for s in shown["build"]["skipped"]}
    assert {"compile/max-autotune", "compile/registers"} <= skipped  # what needs a GPU is named

    fresh = {"PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "home-serve")}
    cache = tmp_path / "elsewhere" / "cache"
    python.kc("install", str(bundle), "--cache-dir", str(cache), "--no-gpu-check", env=fresh, check=True)
    variables = json.loads(python.kc("env", "--cache-dir", str(cache), "--json", env=fresh, check=True).stdout)
    assert variables["VLLM_FORCE_AOT_LOAD"] == "1"
    assert Path(variables["VLLM_CACHE_ROOT"]).is_relative_to(cache)
    loaded = _load(python, model, variables, tmp_path)
    counters = loaded["vllm_counters"]
    assert counters.get("num_aot_artifacts_loaded") == 1, loaded.get("after_save") or loaded.get("error")
    assert "num_aot_compiles" not in counters and "unique_graphs" not in loaded["dynamo_stats"]
    assert "triton_compile" not in loaded["events"] and "gcc_build" not in loaded["events"]

    changed = python.kc("install", str(bundle), "--cache-dir", str(tmp_path / "c2"), "--no-gpu-check",
                        env={**fresh, "VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE": "0"})
    assert changed.returncode == 23, changed.stderr[-2000:]
    assert "VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE" in changed.stderr
    assert not (tmp_path / "c2" / "vllm").exists()
    other = ServeCommand((str(model), *FLAGS, "--max-num-batched-tokens", "1024")).text
    differs = python.kc("install", str(bundle), "--cache-dir", str(tmp_path / "c3"), "--no-gpu-check", "--serve",
                        other, env=fresh)
    assert differs.returncode == 23, differs.stderr[-2000:]
    assert "max_num_batched_tokens" in differs.stderr
