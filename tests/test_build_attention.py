"""The ``attention`` exercise on the CPU: a cross build of vLLM 0.33's TRITON_ATTN kernels for sm_90.

Llama-3.1-8B's attention (32 heads, 8 KV heads, head 128, bf16, block 16, TP 1) on an H200 for a small
server (20 sequences, 512-token context, 128-token steps: capture sizes 1..40 and 20, so the 3D threshold is 16 and
both 2D and 3D meet the ``num_seqs`` classes 1, 16n and other), built through the Python API with the task
as an extra task. The bundle must hold both ``kernel_unified_attention`` variants, ``reduce_segments`` and
the cache write; an independent probe (tests/probes/attention_keys.py: its own platform, backend objects
built without the ``Attention`` layer or a ``VllmConfig``, contiguous tensors, a random sweep of batch
compositions) must find every key it asks for in the installed bundle, and must miss for a server whose
context is longer than the build's (another block-table width class).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import ROOT, clean_env, kc

import kernelcache
from kernelcache.format import archive
from kernelcache.plan.tasks import Task

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARCH, GPU, SMS = "sm_90", "h200", 132
LLAMA_31_8B = {"num_heads": 32, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16", "block_size": 16}
SEQS, MAX_LEN, TOKENS = 20, 512, 128
KERNELS = {"kernel_unified_attention", "reduce_segments", "reshape_and_cache_kernel_flash"}


@pytest.fixture(scope="module")
def attention_build(tmp_path_factory, build_cache) -> tuple[Path, dict]:
    """The bundle and the task's summary; ``paths=["registry"]`` with bf16 logits gives the sampler nothing
    to run, so the attention task is the build's only work."""
    out = tmp_path_factory.mktemp("attention")
    task = Task("kernelcache.exercise.vllm_attention:attention", {
        **LLAMA_31_8B, "max_num_seqs": SEQS, "max_model_len": MAX_LEN, "max_num_batched_tokens": TOKENS},
        label="attention")
    result = kernelcache.build(ARCH, gpus=[GPU], paths=["registry"], dtypes=["bfloat16"], mode="cross",
                               extra_tasks=(task,), output_dir=out / "bundles", workdir=out / "work",
                               build_cache=str(build_cache))
    (bundle,) = result.bundles
    (job,) = (out / "work").glob("*/jobs/extra/job.json.result")
    (summary,) = [t["summary"] for t in json.loads(job.read_text())["tasks"] if t["label"] == "attention"]
    return Path(bundle.path), summary


@pytest.fixture(scope="module")
def installed(attention_build, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("installed") / "cache"
    kc("install", str(attention_build[0]), "--cache-dir", str(cache), check=True)
    return cache


def probe(cache: Path, max_len: int, rounds: int) -> list[dict]:
    shape = [LLAMA_31_8B[k] for k in ("num_heads", "num_kv_heads", "head_size", "dtype", "block_size")]
    args = [str(v) for v in (90, SMS, *shape, SEQS, max_len, TOKENS, rounds)]
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "probes" / "attention_keys.py"), *args],
                          capture_output=True, text=True, timeout=900, env=clean_env(TRITON_CACHE_DIR=str(cache)))
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_server_path_is_triton_attn_with_cuda_graph_thresholds(attention_build):
    _, summary = attention_build
    assert (summary["backend"], summary["impl"], summary["builder"]) == (
        "TRITON_ATTN", "TritonAttentionImpl", "TritonAttentionMetadataBuilder")
    assert summary["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    # vllm/config/vllm.py _set_cudagraph_sizes: 1, 2, 4, multiples of 8 up to 2 * max_num_seqs, plus max_num_seqs
    assert summary["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16, 20, 24, 32, 40]
    # 128 // 8 KV heads = 16, a capture size; the scratch holds min(16, max_num_seqs) query tokens
    assert (summary["seq_threshold_3D"], summary["scratch_rows_3d"], summary["eager_threshold"]) == (16, 16, 16)
    assert summary["block_table_width"] == MAX_LEN // 16
    assert set(summary["paths"]) == {f"{d}:{c}" for d in ("2D", "3D") for c in ("1", "16n", "other")}


def test_the_summary_lists_what_was_faked(attention_build):
    _, summary = attention_build
    faked = summary["substitutions"]
    assert [c["call"] for c in faked["torch_cuda"]] == ["torch.cuda.get_device_capability"]
    assert faked["torch_cuda"][0]["returns"] == [9, 0]
    assert {m["module"] for m in faked["imports"]} <= {"vllm.vllm_flash_attn", "einops"}


def test_bundle_holds_2d_and_3d_attention_and_the_cache_write(attention_build):
    bundle, _ = attention_build
    data = json.loads(kc("inspect", str(bundle), "--json", check=True).stdout)
    assert {k["name"] for k in data["kernels"]} == KERNELS
    assert set(data["build"]["coverage"]["kernel_unified_attention"]["by_path"]) == {"attention"}
    kernels = archive.read_manifest(bundle).kernels
    unified = [k for k in kernels if k.name == "kernel_unified_attention"]
    # num_seqs classes 1 / 16n / other, each in 2D and in 3D
    assert len(unified) == 6
    assert len([k for k in kernels if k.name == "reduce_segments"]) == 3


def test_every_key_the_probe_asks_for_is_a_hit(attention_build, installed):
    bundle, _ = attention_build
    events = probe(installed, MAX_LEN, rounds=60)
    assert {e["name"] for e in events} == KERNELS
    missed = [e for e in events if not e["hit"]]
    assert not missed, missed[:3]
    assert {e["key"] for e in events} <= {k.key for k in archive.read_manifest(bundle).kernels}


def test_the_probe_misses_for_a_longer_context(installed, tmp_path):
    """1152 tokens: a 72-block table (72 % 16 != 0) where the build's was 32 blocks wide."""
    missed = {e["name"] for e in probe(installed, 1152, rounds=0) if not e["hit"]}
    assert "kernel_unified_attention" in missed, missed


@pytest.mark.parametrize("change", [{"dtype": "float32"}, {"kv_cache_dtype": "fp8"}, {"tensor_parallel_size": 3},
                                    {"block_size": 8}, {"entries": ["verify"]}])
def test_bad_arguments_fail_before_anything_is_imported(change):
    from kernelcache.exercise.vllm_attention import attention

    modules = set(sys.modules)
    with pytest.raises(ValueError, match="attention: "):
        attention(**{**LLAMA_31_8B, "max_num_seqs": 4, **change})
    assert not {m for m in set(sys.modules) - modules if m.startswith(("vllm", "torch", "einops"))}
