"""The ``moe`` exercise on the CPU: a cross build of vLLM 0.33's fused-MoE Triton kernels for sm_90.

Qwen3-30B-A3B's MoE layer (128 experts, hidden 2048, moe_intermediate_size 768, top-8, bf16, TP 1) on an
H200, every token count up to 1024, through the build's Python API with the task as an extra task; the
layer as models build it and vLLM's functional ``fused_experts``. The bundle must hold every key an
independent probe asks for (tests/probes/moe_keys.py: its own platform and layer construction, gate
included, a random sweep of token counts, against the installed bundle: every compile a disk hit), and the
probe must see misses for token counts the build did not run. About 2.5 minutes on 2 cores
(the exercise task itself about 95 s: 2 x 1024 forwards under FakeTensors, 78 compiles and launchers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import ROOT, clean_env, kc

from kernelcache.format import archive
from kernelcache.plan.tasks import Task

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARCH, GPU, SMS, PRODUCT = "sm_90", "h200", 132, "NVIDIA H200"
QWEN3_30B_A3B = {"num_experts": 128, "hidden_size": 2048, "intermediate_size": 768, "top_k": 8,
                 "dtype": "bfloat16"}
MAX_M = 1024
ENTRIES = ["layer", "fused_experts"]
C_OPS = {"_moe_C::topk_softmax", "_moe_C::moe_align_block_size", "_C::silu_and_mul", "_moe_C::moe_sum"}


@pytest.fixture(scope="module")
def moe_build(tmp_path_factory, build_cache) -> tuple[Path, dict]:
    """The bundle and the task's summary. ``paths=["registry"]`` with bf16 logits only gives the sampler
    nothing to run (its registry path needs float32), so the MoE task is the build's only work."""
    from kernelcache.build import build

    out = tmp_path_factory.mktemp("moe")
    task = Task("kernelcache.exercise.vllm_moe:moe", {**QWEN3_30B_A3B, "max_num_batched_tokens": MAX_M,
                                                      "entries": ENTRIES}, label="moe")
    result = build(ARCH, gpus=[GPU], paths=["registry"], dtypes=["bfloat16"], mode="cross", extra_tasks=(task,),
                   output_dir=out / "bundles", workdir=out / "work", build_cache=str(build_cache))
    (bundle,) = result.bundles
    (job,) = (out / "work").glob("*/jobs/extra/job.json.result")
    (summary,) = [t["summary"] for t in json.loads(job.read_text())["tasks"] if t["label"] == "moe"]
    return Path(bundle.path), summary


def probe(bundle: Path, cache: Path, *ms: int) -> list[dict]:
    if not cache.exists():
        kc("install", str(bundle), "--cache-dir", str(cache), check=True)
    dims = [QWEN3_30B_A3B[k] for k in ("num_experts", "hidden_size", "intermediate_size", "top_k", "dtype")]
    args = [str(v) for v in (90, SMS, PRODUCT, *dims, MAX_M, *ms)]
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "probes" / "moe_keys.py"), *args],
                          capture_output=True, text=True, timeout=900, env=clean_env(TRITON_CACHE_DIR=str(cache)))
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_server_path_is_triton_experts_with_the_h200_config(moe_build):
    _, summary = moe_build
    assert (summary["backend"], summary["experts"]) == ("TRITON", "TritonExperts")
    assert summary["prepare_finalize"] == "MoEPrepareAndFinalizeNoDPEPModular"
    assert summary["tuned_config"].endswith("configs/E=128,N=768,device_name=NVIDIA_H200.json")
    assert (summary["m_values"], summary["m_max"], summary["entries"]) == (MAX_M, MAX_M, ENTRIES)
    # naive block assignment exactly where M * top_k * 4 <= E (fused_moe.py _prepare_expert_assignment)
    assert summary["naive_block_assignment_m"] == [m for m in range(1, MAX_M + 1) if m * 8 * 4 <= 128]
    substituted = {op["op"] for op in summary["substitutions"]["ops"]}
    assert substituted | set(summary["substitutions"]["ops_present"]) >= C_OPS  # each one substituted or real
    assert {c["call"] for c in summary["substitutions"]["calls"]} == {"torch.ops.vllm.moe_forward",
                                                                      "torch.ops.vllm.fused_experts"}


def test_bundle_holds_fused_moe_kernel_from_the_moe_task(moe_build):
    bundle, summary = moe_build
    data = json.loads(kc("inspect", str(bundle), "--json", check=True).stdout)
    assert {k["name"] for k in data["kernels"]} == {"fused_moe_kernel"}
    coverage = data["build"]["coverage"]["fused_moe_kernel"]
    assert set(coverage["by_path"]) == {"moe"}
    # each tile config the JSON gives for 1..MAX_M is compiled for both GEMMs (their top_k differs)
    assert coverage["variants"] >= 2 * summary["tile_configs"]


def test_every_key_the_probe_asks_for_is_a_hit(moe_build, tmp_path):
    bundle, _ = moe_build
    events = probe(bundle, tmp_path / "installed")
    assert {e["entry"] for e in events} == set(ENTRIES)
    assert {e["name"] for e in events} == {"fused_moe_kernel"}
    missed = [e for e in events if not e["hit"]]
    assert not missed, missed[:3]
    bundled = {k.key for k in archive.read_manifest(bundle).kernels}
    assert {e["key"] for e in events} <= bundled


def test_the_probe_sees_misses_beyond_the_built_token_counts(moe_build, tmp_path):
    """The tuned JSON gives other tiles for 2048 and 4096 tokens than for any count up to 1024."""
    bundle, _ = moe_build
    events = probe(bundle, tmp_path / "installed", 2048, 4096)
    assert {e["entry"] for e in events if not e["hit"]} == set(ENTRIES)


@pytest.mark.parametrize("change", [{"dtype": "float32"}, {"entries": ["fused_moe"]}, {"tensor_parallel_size": 5}])
def test_bad_arguments_fail_before_anything_is_imported(change):
    from kernelcache.exercise.vllm_moe import moe

    modules = set(sys.modules)
    with pytest.raises(ValueError, match="moe: "):
        moe(**{**QWEN3_30B_A3B, "max_num_batched_tokens": 4, **change})
    assert not {m for m in set(sys.modules) - modules if m.startswith(("vllm", "torch", "einops"))}
