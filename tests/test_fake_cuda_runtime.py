"""torch.compile of a CUDA graph on this CPU-only machine for a named product (exercise/fake_cuda_runtime.py): the
runtime shim is what lets a FakeTensor on ``cuda`` be indexed, and Dynamo, Inductor and Triton then produce an
AOT-compiled function for sm_90 that a fresh process loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import clean_env

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.version.cuda:
    pytest.skip("a CPU-only torch build: Inductor generates no CUDA code with it", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = "NVIDIA H100 80GB HBM3"

INDEX = f"""
import sys
from kernelcache.exercise import fake_cuda_runtime, fake_target
fake_target.activate(90, 132, stub_dir=sys.argv[1], definitions=fake_cuda_runtime.DRIVER_DEFINITIONS)
fake_cuda_runtime.install(90, 132, {PRODUCT!r}, 85520809984)
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    x = torch.empty(8, 4, device="cuda")
    print(tuple(x[..., :2].shape))
"""

FAKES = f"""
import os, sys
from kernelcache.exercise import fake_cuda_runtime, fake_target
fake_target.activate(90, 132, stub_dir=sys.argv[2], definitions=fake_cuda_runtime.DRIVER_DEFINITIONS)
fake_cuda_runtime.install(90, 132, {PRODUCT!r}, 85520809984)
fake_cuda_runtime.skip_compile_time_autotune()
fake_cuda_runtime.combine_without_benchmark()
import torch
from torch._subclasses.fake_tensor import FakeTensorMode


def f(x, w):
    var = x.float().pow(2).mean(-1, keepdim=True)
    y = (x.float() * torch.rsqrt(var + 1e-5)).to(x.dtype) * w
    return torch.nn.functional.silu(y[..., :256]) * y
"""

COMPILE = FAKES + """
with FakeTensorMode(allow_non_fake_inputs=True):
    x = torch.empty(64, 256, dtype=torch.bfloat16, device="cuda")
    w = torch.empty(256, dtype=torch.bfloat16, device="cuda")
torch._dynamo.mark_dynamic(x, 0)
import contextlib
aot = getattr(torch._dynamo.config, "enable_aot_compile", None)  # torch 2.11 (vLLM's wrapper patches it the same way)
with torch._dynamo.config.patch(enable_aot_compile=True) if aot is not None else contextlib.nullcontext():
    compiled = torch.compile(f, fullgraph=True).aot_compile(((x, w), {}))
compiled.save_compiled_function(sys.argv[1])
"""

LOAD = FAKES + """
import json
with open(sys.argv[1], "rb") as handle:
    loaded = torch.compiler.load_compiled_function(handle, f_globals=globals())
info = loaded._artifacts.system_info
print(json.dumps({"gpu_name": info.gpu_name, "triton": list(info.triton_version)}))
"""


def _python(code: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    from kernelcache.exercise.fake_cuda_runtime import build_cudart_shim

    return build_cudart_shim(tmp_path_factory.mktemp("shim"))


def _env(tmp: Path, shim: Path | None) -> dict:
    extra = {"CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT), "TRITON_CACHE_DIR": str(tmp / "triton"),
             "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor")}
    if shim is not None:
        extra["LD_PRELOAD"] = str(shim)
    return clean_env(**extra)


def test_the_shim_lets_a_fake_cuda_tensor_be_indexed(shim, tmp_path):
    stub = str(tmp_path / "stub")
    preloaded = _python(INDEX, stub, env=_env(tmp_path, shim))
    assert preloaded.returncode == 0, preloaded.stderr[-2000:]
    assert preloaded.stdout.strip() == "(8, 2)"
    plain = _python(INDEX, stub, env=_env(tmp_path, None))
    assert plain.returncode != 0  # the CUDA runtime refuses the device guard without a driver


@pytest.mark.slow
def test_an_aot_compiled_function_for_sm_90_built_without_a_gpu_loads_in_a_fresh_process(shim, tmp_path):
    saved, stub = tmp_path / "fn.bin", str(tmp_path / "stub")
    built = _python(COMPILE, str(saved), stub, env=_env(tmp_path / "build", shim))
    assert built.returncode == 0, built.stderr[-3000:]
    cubins = list((tmp_path / "build" / "triton").rglob("*.cubin"))
    assert cubins, "Inductor's Triton kernels were not compiled"
    for cubin in cubins:
        meta = json.loads(cubin.with_suffix(".json").read_text())
        assert meta["target"]["arch"] == 90 and meta["target"]["backend"] == "cuda"
    loaded = _python(LOAD, str(saved), stub, env=_env(tmp_path / "load", shim))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    info = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert info["gpu_name"] == PRODUCT
    import triton

    assert info["triton"] == [int(p) for p in triton.__version__.split(".")[:2]]
