"""The flashinfer_attention path: the FlashInfer JIT modules vLLM 0.33's FLASHINFER backend asks for, prebuilt.

The module list comes from vLLM's own backend run under the fake target (exercise/vllm_flashinfer.py): one
exercise process runs the task for several attention shapes without building anything, and each change of head
size, dtype, sliding window, soft-cap or artifactory reachability must change the URIs FlashInfer's spec builders
return. The plan adds the path for ``--attention-backend FLASHINFER``. An install refuses a module whose sources in
the installed FlashInfer are not the ones it was built from. The slow test builds one module with nvcc (XQA's decode
module, the decode batches only), bundles, installs and verifies it through FlashInfer's own lookup.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.common import clean_env, kc
from helpers.flashinfer import require_flashinfer

import kernelcache
from kernelcache.errors import UsageError
from kernelcache.exercise.worker import Job
from kernelcache.format.fingerprint import compare_flashinfer, flashinfer_sources_digest
from kernelcache.format.manifest import FlashInferModule
from kernelcache.plan.recipe import load
from kernelcache.plan.tasks import Task, plan_units

TASK = "kernelcache.exercise.vllm_flashinfer:flashinfer_attention"
SMALL = {"num_heads": 8, "num_kv_heads": 2, "head_size": 128, "dtype": "bfloat16", "max_num_seqs": 8,
         "max_model_len": 1024, "max_num_batched_tokens": 512, "build": False}
VARIANTS = {"base": {}, "head64": {"head_size": 64}, "fp16": {"dtype": "float16"},
            "window": {"sliding_window": 256}, "softcap": {"logits_soft_cap": 30.0}, "no_cubins": {"cubins": False}}


def run_tasks(tmp: Path, capability: int, tasks: dict[str, dict]) -> dict[str, dict]:
    """One cross-mode exercise process for ``capability`` running the task once per entry: label -> summary."""
    from kernelcache.exercise.flashinfer_sampling import arch_list, find_toolchain

    env = {"FLASHINFER_CUDA_ARCH_LIST": arch_list(f"sm_{capability}"), "CUDA_HOME": str(find_toolchain().root),
           "FLASHINFER_WORKSPACE_BASE": str(tmp / "fi")}
    setup = (Task("kernelcache.exercise.vllm_sampler:setup_platform",
                  {"capability": capability, "sm_count": 132, "product": "NVIDIA H200"}, label="platform"),)
    job = Job(cache_dir=str(tmp / "cache"), compile_log=str(tmp / "compiles.jsonl"), capability=capability,
              sm_count=132, mode="cross", tasks=tuple(Task(TASK, {**SMALL, **kw}, label=k) for k, kw in tasks.items()),
              prebuild=False, env=env, setup=setup)
    path = tmp / "job.json"
    path.write_text(job.to_json())
    done = subprocess.run([sys.executable, "-m", "kernelcache.exercise.worker", str(path)], capture_output=True,
                          text=True, timeout=900, env=clean_env())
    result = json.loads((tmp / "job.json.result").read_text())
    failed = [t for t in result["tasks"] if not t["ok"]]
    assert not failed, (failed[0].get("traceback") or done.stderr)[-3000:]
    return {t["label"]: t["summary"] for t in result["tasks"] if t["label"] in tasks}


@pytest.fixture(scope="module")
def hopper(tmp_path_factory) -> dict[str, dict]:
    pytest.importorskip("vllm")
    require_flashinfer()
    return run_tasks(tmp_path_factory.mktemp("sm90"), 90, VARIANTS)


def names(summary: dict) -> set[str]:
    return {m["name"] for m in summary["modules"]}


@pytest.mark.vllm
@pytest.mark.flashinfer
@pytest.mark.slow
def test_hopper_asks_for_xqa_decode_and_fa3_prefill_of_the_shape(hopper):
    base = hopper["base"]
    assert base["backend"] == "FLASHINFER" and base["decode_kernel"] == "xqa"
    xqa = {n for n in names(base) if n.startswith("xqa_")}
    prefill = {n for n in names(base) if n.startswith("batch_prefill_with_kv_cache")}
    assert xqa == {"xqa_input_bf16_kv_cache_bf16_output_bf16_page_size_16_head_dim_128_head_group_ratio_4_"
                   "use_sliding_window_False_use_spec_dec_False_spec_q_seq_len_1"}
    assert prefill == {"batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_"
                       "128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False_sm90"}
    assert names(base) == xqa | prefill and base["left_out"] == {}
    assert {m["first_batch"] for m in base["modules"]} == {"capture", "prefill"}
    assert all(m["kind"] == "nvcc" and m["sources_sha256"] for m in base["modules"])
    assert any(s.startswith("flashinfer/data/csrc/xqa/") for m in base["modules"] for s in m["sources"])


@pytest.mark.vllm
@pytest.mark.flashinfer
@pytest.mark.slow
@pytest.mark.parametrize(("variant", "marks"), [
    ("head64", ("head_dim_64", "head_dim_qk_64")), ("fp16", ("input_f16", "dtype_q_f16")),
    ("window", ("use_sliding_window_True", "use_swa_True")), ("softcap", ("use_logits_cap_True",))])
def test_each_shape_change_changes_the_uris(hopper, variant, marks):
    changed = names(hopper[variant])
    assert changed and not changed & names(hopper["base"])
    for mark in marks:
        assert any(mark in n for n in changed), (mark, changed)


@pytest.mark.vllm
@pytest.mark.flashinfer
@pytest.mark.slow
def test_without_nvidias_artifactory_decode_is_flashinfers_own(hopper):
    summary = hopper["no_cubins"]
    assert summary["decode_kernel"] == "flashinfer-native"
    assert not any(n.startswith("xqa_") for n in names(summary))
    assert any(n.endswith("_kv_stride_equal") for n in names(summary))  # fa2 decode through the prefill kernels


@pytest.mark.vllm
@pytest.mark.flashinfer
@pytest.mark.slow
def test_blackwell_trtllm_gen_is_left_out_with_its_reason(tmp_path):
    pytest.importorskip("vllm")
    require_flashinfer()
    summaries = run_tasks(tmp_path, 100, {"auto": {"attention_backend": "auto"},
                                          "no_cubins": {"attention_backend": "auto", "cubins": False}})
    trtllm, native = summaries["auto"], summaries["no_cubins"]
    assert trtllm["backend"] == "FLASHINFER" and trtllm["decode_kernel"] == "trtllm-gen"
    assert names(trtllm) == {"fmha_gen"} and "artifactory" in trtllm["left_out"]["fmha_gen"]
    assert any(k.startswith("artifact:") for k in trtllm["left_out"])
    assert native["decode_kernel"] == "flashinfer-native" and native["left_out"] == {}
    assert not any(n.endswith("_sm90") for n in names(native))


def test_the_flashinfer_backend_flag_adds_the_path_per_window():
    plan = load("gemma-2-9b-flashinfer")
    (unit,) = plan_units(plan)
    windows = sorted((t.kwargs["sliding_window"], t.kwargs["logits_soft_cap"]) for t in unit[1])
    assert windows == [(0, 50.0), (4096, 50.0)]
    llama = load("llama-3.1-8b").override(attention_backend="FLASHINFER")
    assert "flashinfer_attention" in llama.paths
    assert "flashinfer_attention" not in llama.override(attention_backend="TRITON_ATTN").paths
    assert "flashinfer_attention" in llama.override(attention_backend="auto").paths
    with pytest.raises(UsageError, match="flashinfer_attention path"):
        load("llama-3.1-8b").override(paths=["flashinfer_attention"], attention_backend="FLASH_ATTN")


@pytest.mark.flashinfer
def test_install_refuses_a_module_whose_sources_changed():
    require_flashinfer()
    import flashinfer

    root = Path(flashinfer.__file__).resolve().parent.parent
    sources = ("flashinfer/data/csrc/xqa/mha.cu", "flashinfer/data/csrc/xqa/xqa_wrapper.cu")
    module = FlashInferModule("xqa_x", _version(), "13.0.88", ("sm90a",), None, (),
                              sources, flashinfer_sources_digest(sources, root))
    manifest = _manifest(module)
    assert compare_flashinfer(manifest, module.version, None, None) == []
    changed = _manifest(replace(module, sources_sha256="0" * 64))
    (diff,) = compare_flashinfer(changed, module.version, None, None)
    assert (diff.field, diff.blocking) == ("flashinfer[xqa_x].sources", True)


def _version() -> str:
    from kernelcache.format.fingerprint import package_version

    return package_version("flashinfer-python")


def _manifest(module: FlashInferModule):
    from kernelcache.format.fingerprint import local_environment
    from kernelcache.format.manifest import Build, Manifest, Target

    return Manifest(Target("cuda", "sm_90"), local_environment(["sm_90"]), Build("test", "cross"),
                    flashinfer=(module,))


@pytest.mark.vllm
@pytest.mark.flashinfer
@pytest.mark.slow
def test_a_built_module_is_bundled_and_found_by_flashinfers_lookup(tmp_path, monkeypatch):
    """XQA's decode module (about 25 s of nvcc on 2 cores) through build, install and verify."""
    pytest.importorskip("vllm")
    require_flashinfer()
    monkeypatch.setenv("KERNELCACHE_FLASHINFER_WORKSPACE", str(tmp_path / "fi"))
    task = Task(TASK, {**SMALL, "build": None, "kinds": ["decode"]}, label="flashinfer_attention")
    result = kernelcache.build("sm_90", gpus=["h200"], paths=["registry"], dtypes=["bfloat16"], mode="cross",
                               extra_tasks=(task,), output_dir=tmp_path / "bundles", build_cache=False,
                               attention_backend="FLASHINFER")
    (bundle,) = result.bundles
    (module,) = bundle.manifest.flashinfer
    assert module.name.startswith("xqa_input_bf16") and module.archs == ("sm90a",) and module.sources_sha256
    assert not bundle.manifest.kernels  # XQA reads the block table: the builder's Triton kernel feeds paged FlashInfer
    kc("install", str(bundle.path), "--cache-dir", str(tmp_path / "cache"), check=True)
    listed = kc("ls", "--cache-dir", str(tmp_path / "cache"), check=True).stdout
    assert f"FlashInfer module {module.name}" in listed
    checked = kc("verify", "--cache-dir", str(tmp_path / "cache"), "--json", check=True).stdout
    (check,) = json.loads(checked)["flashinfer"]
    assert check["name"] == module.name and check["found"] and check["loaded"], check
