"""The ``gdn`` exercise on the CPU: a cross build of vLLM 0.33's gated-delta-net Triton kernels (Qwen3-Next /
Qwen3.5) for sm_90, every autotune candidate of the FLA chunk kernels included.

Qwen3-Next-80B-A3B's GDN layer (Qwen/Qwen3-Next-80B-A3B-Instruct config.json: hidden 2048, 16 key heads and 32 value
heads of 128, conv kernel 4; gated attention with 2 KV heads of 256, which the GDN state's page is padded to; bf16)
on an H200, up to 4 sequences and 96 batched tokens, built as ``build --model-config <its config.json> --path gdn
--gdn-prefill-backend triton``. The bundle must hold every candidate config of every autotuned FLA kernel and every
key an independent probe asks for (tests/probes/gdn_keys.py: its own platform, layer construction, page arithmetic
and seeded random batches, against the installed bundle: every compile a disk hit), also for a server on vLLM's
default FlashInfer prefill; the probe must see misses for a state dtype the build did not run; ``verify`` replays
the plan with no compile. Drafts (MTP) are checked on a second, decode-only build of a Qwen3.5 layer (the flat
layout, whose drafts take vLLM's fused CUDA MTP path where vLLM's ops are built).
About 4 to 7 minutes on 2 shared cores (the main task about 90 s: 96 compiles under the fake target).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.autotune import check_candidates_bundled, check_probe_hits
from helpers.common import ROOT, clean_env, kc

from kernelcache.format import archive
from kernelcache.plan.tasks import Task

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARCH, GPU, SMS, PRODUCT = "sm_90", "h200", 132, "NVIDIA H200"
# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json, the fields that decide its kernels.
CONFIG = {"architectures": ["Qwen3NextForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
          "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "num_experts": 512,
          "num_experts_per_tok": 10, "moe_intermediate_size": 512, "linear_num_key_heads": 16,
          "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
          "linear_conv_kernel_dim": 4, "torch_dtype": "bfloat16"}
LAYER = {k: CONFIG[k] for k in ("hidden_size", "linear_num_key_heads", "linear_num_value_heads",
                                "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
                                "num_key_value_heads", "head_dim")}
SERVED = {**LAYER, "dtype": "bfloat16", "layout": "interleaved", "mamba_ssm_cache_dtype": "auto",
          "num_speculative_tokens": 0, "gdn_prefill_backend": "triton", "max_model_len": 8192}
MAX_SEQS, MAX_TOKENS = 4, 96
AUTOTUNED = {"chunk_local_cumsum_scalar_kernel", "chunk_scaled_dot_kkt_fwd_kernel",
             "merge_16x16_to_64x64_inverse_kernel", "recompute_w_u_fwd_kernel",
             "chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "chunk_fwd_kernel_o"}
PLAIN = {"_causal_conv1d_fwd_kernel", "_causal_conv1d_update_kernel", "_fused_post_conv_kernel",
         "fused_recurrent_gated_delta_rule_packed_decode_kernel", "fused_sigmoid_gating_delta_rule_update_kernel"}
DECODE = {"_causal_conv1d_update_kernel", "fused_recurrent_gated_delta_rule_packed_decode_kernel"}
# Qwen3.5's layout with two drafts per request, decode batches only (spec-decode rows).
QWEN3_5_DRAFTS = {**LAYER, "layout": "flat", "num_speculative_tokens": 2, "mamba_ssm_cache_dtype": "float32"}


@pytest.fixture(scope="module")
def gdn_build(tmp_path_factory, build_cache) -> tuple[Path, dict]:
    """The bundle and the task's summary, built as users build it: ``--model-config`` with a Qwen3-Next
    config.json (the plan maps its fields to the task's, plan/model.py) and ``--path gdn`` only."""
    from kernelcache.build import build

    out = tmp_path_factory.mktemp("gdn")
    config = out / "Qwen3-Next-80B-A3B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(CONFIG))
    result = build(ARCH, gpus=[GPU], model_config=str(config), paths=["gdn"], max_num_seqs=MAX_SEQS,
                   max_num_batched_tokens=MAX_TOKENS, gdn_prefill_backend="triton", mode="cross",
                   output_dir=out / "bundles", workdir=out / "work", build_cache=str(build_cache))
    (bundle,) = result.bundles
    return Path(bundle.path), summary_of(out / "work", "model")


@pytest.fixture(scope="module")
def drafts_build(tmp_path_factory, build_cache) -> tuple[Path, dict]:
    """Decode batches with two drafts per request on a Qwen3.5 layer: the task alone (``paths=["registry"]``
    with bf16 logits gives the sampler nothing to run)."""
    from kernelcache.build import build

    out = tmp_path_factory.mktemp("gdn-drafts")
    task = Task("kernelcache.exercise.vllm_gdn:gdn", {
        **QWEN3_5_DRAFTS, "dtype": "bfloat16", "max_num_seqs": MAX_SEQS, "max_num_batched_tokens": MAX_TOKENS,
        "entries": ["decode"]}, label="gdn")
    result = build(ARCH, gpus=[GPU], paths=["registry"], dtypes=["bfloat16"], mode="cross", extra_tasks=(task,),
                   output_dir=out / "bundles", workdir=out / "work", build_cache=str(build_cache))
    (bundle,) = result.bundles
    return Path(bundle.path), summary_of(out / "work", "extra")


def summary_of(work: Path, unit: str) -> dict:
    (job,) = work.glob(f"*/jobs/{unit}/job.json.result")
    (summary,) = [t["summary"] for t in json.loads(job.read_text())["tasks"] if t["label"] == "gdn"]
    return summary


def probe(bundle: Path, cache: Path, config: dict, rounds: int, kind: str = "") -> list[dict]:
    if not cache.exists():
        kc("install", str(bundle), "--cache-dir", str(cache), check=True)
    args = [str(v) for v in (90, SMS, PRODUCT, json.dumps(config), MAX_SEQS, MAX_TOKENS, rounds)] + [kind] * bool(kind)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "probes" / "gdn_keys.py"), *args],
                          capture_output=True, text=True, timeout=900, env=clean_env(TRITON_CACHE_DIR=str(cache)))
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_server_path_and_what_was_substituted(gdn_build):
    _, summary = gdn_build
    assert (summary["prefill_backend"], summary["decode_kernel"]) == ("triton", "triton") and summary["packed_decode"]
    assert not summary["fused_mtp_decode"] and summary["norm"].startswith("forward_native")
    assert summary["ssm_state"]["dtype"] == summary["conv_state"]["dtype"] == "bfloat16"
    # The page holds the state (3 x 8192 conv + 32 x 128 x 128 ssm, bf16) padded to 544-token attention blocks of
    # 2 KV heads x 256 x bf16 x (K and V): 544 x 2048 bytes.
    assert summary["page_bytes"] == 544 * 2048 and summary["ssm_state"]["stride"][0] == 544 * 2048 // 2
    assert set(summary["calls"]) == {"profile", "decode", "prefill", "mixed"} and summary["calls"]["profile"] == 1
    substituted = summary["substitutions"]
    queries = substituted["device_queries"]
    assert {k: v for k, v in queries.items() if k != "initialises_cuda"} == {
        "is_nvidia_hopper": True, "check_shared_mem": True, "is_tma_supported": False, "answered": True}
    assert queries["initialises_cuda"] is (release() == "0.33")  # tests/test_gdn_shared_memory.py
    assert [c["call"] for c in substituted["calls"]] == ["torch.ops.vllm.qwen_gdn_attention_core",
                                                         "torch.ops.vllm.qwen_gdn_attention_core_fused_norm_packed"]
    assert {op["op"] for op in substituted["ops"]} | set(substituted["ops_present"]) >= {
        "_C::cutlass_scaled_mm_supports_fp8", "_C::fused_gdn_decode_post_conv_mtp"}


def test_every_autotune_candidate_is_in_the_bundle(gdn_build):
    bundle, summary = gdn_build
    tuned = {name: seen for name, seen in summary["autotune"].items() if seen["candidates"]}
    assert set(tuned) == AUTOTUNED
    assert {k.name for k in archive.read_manifest(bundle).kernels} == AUTOTUNED | PLAIN
    check_candidates_bundled(bundle, tuned)
    assert all(len(seen["tuning_keys"]) == 1 for seen in tuned.values())  # keyed on head counts and dims alone
    # chunk_fwd_kernel_o's block sizes: check_shared_mem()'s answer on the target, and on vLLM 0.34 (whose FLA
    # import leaves CUDA uninitialised) also the answer of a process that imports FLA before CUDA is up.
    blocks = {(k.constexprs["BK"], k.constexprs["BV"]) for k in archive.read_manifest(bundle).kernels
              if k.name == "chunk_fwd_kernel_o"}
    hopper, small = ({(a, b) for a in sizes for b in sizes} for sizes in ((64, 128), (32, 64)))
    assert blocks == (hopper if release() == "0.33" else hopper | small)


def release() -> str:
    import vllm

    from kernelcache.plan import releases

    return releases.minor(vllm.__version__)


def test_every_key_the_probe_asks_for_is_a_hit(gdn_build, tmp_path):
    bundle, summary = gdn_build
    events = probe(bundle, tmp_path / "installed", SERVED, rounds=10)
    check_probe_hits(events, bundle, AUTOTUNED | PLAIN, summary["autotune"])


def test_the_bundle_serves_vllms_default_flashinfer_prefill_too(gdn_build, tmp_path):
    """vLLM's default on Hopper runs FlashInfer's GDN prefill (a CUDA module) instead of the FLA chunk kernels; the
    Triton kernels around it are the same, so the triton build serves that server too."""
    bundle, _ = gdn_build
    events = probe(bundle, tmp_path / "installed", {**SERVED, "gdn_prefill_backend": "flashinfer"}, rounds=6)
    compiles = [e for e in events if "key" in e]
    assert {e["name"] for e in compiles} == PLAIN and all(e["hit"] for e in compiles)
    assert not [e for e in events if "candidate" in e]


def test_the_probe_sees_misses_for_a_state_dtype_not_built(gdn_build, tmp_path):
    """An fp32 SSM state (``--mamba-ssm-cache-dtype float32``) changes the decode kernel's state type and the page,
    hence both decode kernels' block strides."""
    bundle, _ = gdn_build
    events = probe(bundle, tmp_path / "installed", {**SERVED, "mamba_ssm_cache_dtype": "float32"}, 2, "decode")
    assert {e["name"] for e in events if "key" in e and not e["hit"]} == DECODE


def test_verify_replays_the_gdn_plan_with_no_compile(gdn_build):
    bundle, _ = gdn_build
    report = json.loads(kc("verify", str(bundle), "--json", check=True, timeout=1500).stdout)
    assert report["ok"] and report["compiles"] == 0 and report["hits"] > 0 and report["unexercised"] == []


def test_drafts_take_the_spec_decode_kernels_and_the_probe_hits_them(drafts_build, tmp_path):
    bundle, summary = drafts_build
    assert summary["fused_mtp_decode"] and summary["num_speculative_tokens"] == 2
    assert summary["conv_state"]["shape"][1:] == [3 + 2, 8192]  # the conv state keeps a row per draft
    events = probe(bundle, tmp_path / "installed", {**SERVED, **QWEN3_5_DRAFTS}, rounds=8, kind="decode")
    compiles = [e for e in events if "key" in e]
    # Drafted rows alone: the conv update with the accepted counts, then vLLM's CUDA MTP kernel (no Triton kernel).
    assert {e["name"] for e in compiles} == {"_causal_conv1d_update_kernel"}
    missed = [e for e in compiles if not e["hit"]]
    assert not missed, missed[:3]
    # One draft fewer: the conv state keeps a row less, so the page and the conv update's strides change.
    fewer = probe(bundle, tmp_path / "installed", {**SERVED, **QWEN3_5_DRAFTS, "num_speculative_tokens": 1}, 2,
                  "decode")
    assert {e["name"] for e in fewer if "key" in e and not e["hit"]} == {"_causal_conv1d_update_kernel"}


@pytest.mark.parametrize("change", [{"dtype": "float32"}, {"entries": ["chunked"]}, {"tensor_parallel_size": 3},
                                    {"mamba_ssm_cache_dtype": "fp8"}, {"layout": "grouped"},
                                    {"gdn_prefill_backend": "cutedsl"}])
def test_bad_arguments_fail_before_anything_is_imported(change):
    from kernelcache.exercise.vllm_gdn import gdn

    modules = set(sys.modules)
    with pytest.raises(ValueError, match="gdn: "):
        gdn(**{**LAYER, "dtype": "bfloat16", "max_num_seqs": 2, "max_num_batched_tokens": 4, **change})
    assert not {m for m in set(sys.modules) - modules if m.startswith(("vllm", "torch", "einops"))}
