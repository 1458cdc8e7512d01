"""FLA's ``check_shared_mem()`` and the CUDA state at import: which ``chunk_fwd_kernel_o`` candidates a gdn build
compiles.

FLA's chunk_o.py picks its block sizes at import (``BKV_LIST = [64, 128] if check_shared_mem() else [32, 64]``);
``check_shared_mem`` asks Triton's driver for the device's shared memory, which fails before ``cuInit``, and takes
the failure for a small device. vLLM 0.33's ops/utils.py asks torch's CUDA device queries first
(``is_nvidia_hopper``), which initialise CUDA; 0.34's asks vLLM's NVML platform, which does not, so on 0.34 a
process that imports FLA before CUDA is up autotunes ``chunk_fwd_kernel_o`` over BK, BV in {32, 64}. On a GPU
that process (``kernelcache tune``'s exercise, before the fix) compiled those candidates, which the CPU build
lacked. The cross build now tells the two releases apart (``import_initialises_cuda``) and, on 0.34, compiles the
candidates of both answers (``uninitialised_configs``). Cross mode, the fake target, no compile here: the build's
assertion on the bundle is tests/test_build_gdn.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.common import ROOT, clean_env

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

SCRIPT = r"""
import importlib, json, os, tempfile
os.environ.update(KERNELCACHE_TARGET_MODE="cross", CUDA_VISIBLE_DEVICES="", TRITON_CACHE_DIR=tempfile.mkdtemp())
from kernelcache.exercise import fake_target
fake_target.activate(90, 132, prebuild=False, stub_dir=tempfile.mkdtemp())
from kernelcache.exercise.vllm_sampler import setup_platform
setup_platform(90, 132, "NVIDIA H100 80GB HBM3")
import vllm
from kernelcache.exercise import vllm_gdn as vg
queries = vg.prepare()["device_queries"]
extra = vg.uninitialised_configs(queries)
kernel = importlib.import_module(vg.FLA + ".chunk_o").chunk_fwd_kernel_o.fn  # under @triton.heuristics
blocks = lambda: sorted({(c.kwargs["BK"], c.kwargs["BV"]) for c in kernel.configs})
warps = lambda: sorted({c.num_warps for c in kernel.configs})
tuner = vg.FlaAutotuneCandidates(extra)
with tuner:
    inside = {"blocks": blocks(), "warps": warps(), "configs": len(kernel.configs)}
print(json.dumps({"version": vllm.__version__, "queries": queries, "extra": sorted(extra), "inside": inside,
                  "after": {"blocks": blocks(), "configs": len(kernel.configs)},
                  "summary": tuner.summary()["chunk_fwd_kernel_o"]}))
"""


def run(python: str) -> dict:
    done = subprocess.run([python, "-c", SCRIPT], capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env=clean_env(PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def check(found: dict) -> None:
    from kernelcache.plan import releases

    queries, inside, after = found["queries"], found["inside"], found["after"]
    # The fake H100 answers check_shared_mem() as CUDA-initialised Hopper does: 64 and 128 blocks, 2 and 4 warps.
    assert queries["check_shared_mem"] and queries["is_nvidia_hopper"] and queries["answered"]
    hopper = [[a, b] for a in (64, 128) for b in (64, 128)]
    assert after == {"blocks": hopper, "configs": 24}  # the module's own list, as it was
    if releases.minor(found["version"]) == "0.33":
        assert queries["initialises_cuda"] and found["extra"] == []
        assert inside == {"blocks": hopper, "warps": [2, 4], "configs": 24}
        assert "added_for_uninitialised_cuda" not in found["summary"]
    else:
        small = [[a, b] for a in (32, 64) for b in (32, 64)]
        assert queries["initialises_cuda"] is False
        assert found["extra"] == ["chunk_fwd_kernel_o", "chunk_local_cumsum_scalar_kernel",
                                  "chunk_local_cumsum_vector_kernel"]
        # 2 x 2 block sizes x 2 warp counts x 3 stage counts each; the 6 of BK = BV = 64 are in both lists.
        assert inside == {"blocks": sorted(map(list, {*map(tuple, hopper), *map(tuple, small)})), "warps": [2, 4],
                          "configs": 42}
        assert found["summary"]["configs"] == 42 and found["summary"]["added_for_uninitialised_cuda"] == 18


def test_the_installed_release_gets_the_candidates_of_each_import_order():
    check(run(sys.executable))


@pytest.mark.serving
@pytest.mark.slow
def test_on_034_chunk_o_gets_the_candidates_of_a_process_importing_fla_before_cuda():
    from test_serving_releases import VENVS, release_venv

    found = run(str(release_venv(VENVS["0.34"]) / "bin" / "python"))
    assert found["version"].startswith("0.34.")
    check(found)
