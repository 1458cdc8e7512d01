"""The ``mamba`` exercise on the CPU: a cross build of vLLM 0.33's Mamba-2 Triton kernels for sm_90, autotune
candidates included.

Nemotron-H-8B's Mamba-2 layer (nvidia/Nemotron-H-8B-Base-8K config.json: hidden 4096, 128 heads of 64, state 128,
8 groups, conv kernel 4, chunk 128; bf16, SSM state float32 as vLLM's NemotronH config class resolves ``auto``) on
an H200, up to 8 sequences and 512 batched tokens, built as ``build --model-config <its config.json> --path mamba``.
The bundle must hold every candidate config of every autotuned SSD kernel and every key an independent probe asks
for (tests/probes/mamba_keys.py: its own platform, layer construction and seeded random batches, against the
installed bundle: every compile a disk hit), and the probe must see misses for a config the build did not run.
About 2 to 5 minutes on 2 shared cores (2 m 10 s and 4 m 45 s measured; the task itself 75-150 s: 70 compiles
under the fake target).
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

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARCH, GPU, SMS, PRODUCT = "sm_90", "h200", 132, "NVIDIA H200"
NEMOTRON_H_8B = {"hidden_size": 4096, "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128,
                 "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "dtype": "bfloat16",
                 "mamba_ssm_cache_dtype": "float32"}
# nvidia/Nemotron-H-8B-Base-8K's config.json, the fields that decide its kernels.
CONFIG = {"architectures": ["NemotronHForCausalLM"], "vocab_size": 131072, "hidden_size": 4096,
          "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128,
          "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
          "torch_dtype": "bfloat16"}
MAX_SEQS, MAX_TOKENS = 8, 512
AUTOTUNED = {"_chunk_cumsum_fwd_kernel", "_chunk_state_fwd_kernel", "_state_passing_fwd_kernel",
             "_bmm_chunk_fwd_kernel", "_chunk_scan_fwd_kernel"}
PLAIN = {"_causal_conv1d_fwd_kernel", "_causal_conv1d_update_kernel", "_selective_scan_update_kernel"}


@pytest.fixture(scope="module")
def mamba_build(tmp_path_factory, build_cache) -> tuple[Path, dict]:
    """The bundle and the task's summary, built as users build it: ``--model-config`` with a Nemotron-H
    config.json (the plan maps its fields to the task's, plan/model.py) and ``--path mamba`` only."""
    from kernelcache.build import build

    out = tmp_path_factory.mktemp("mamba")
    config = out / "Nemotron-H-8B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(CONFIG))
    result = build(ARCH, gpus=[GPU], model_config=str(config), paths=["mamba"], max_num_seqs=MAX_SEQS,
                   max_num_batched_tokens=MAX_TOKENS, mode="cross", output_dir=out / "bundles",
                   workdir=out / "work", build_cache=str(build_cache))
    (bundle,) = result.bundles
    (job,) = (out / "work").glob("*/jobs/model/job.json.result")
    (summary,) = [t["summary"] for t in json.loads(job.read_text())["tasks"] if t["label"] == "mamba"]
    return Path(bundle.path), summary


def probe(bundle: Path, cache: Path, config: dict, rounds: int, entry: str = "") -> list[dict]:
    if not cache.exists():
        kc("install", str(bundle), "--cache-dir", str(cache), check=True)
    args = [str(v) for v in (90, SMS, PRODUCT, json.dumps(config), MAX_SEQS, MAX_TOKENS, rounds)]
    args += [entry] * bool(entry)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "probes" / "mamba_keys.py"), *args],
                          capture_output=True, text=True, timeout=900, env=clean_env(TRITON_CACHE_DIR=str(cache)))
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_the_server_path_and_what_was_substituted(mamba_build):
    _, summary = mamba_build
    assert (summary["ssu_backend"], summary["chunk_size"]) == ("triton", 128)
    assert summary["norm"] == "forward_native (torch)"  # n_groups 8: Mixer2RMSNormGated.forward_cuda
    assert summary["ssm_state"]["dtype"] == "float32" and summary["conv_state"]["dtype"] == "bfloat16"
    assert set(summary["calls"]) == {"profile", "decode", "prefill", "mixed"} and summary["calls"]["profile"] == 1
    substituted = summary["substitutions"]
    assert {op["op"] for op in substituted["ops"]} | set(substituted["ops_present"]) >= {
        "_C::cutlass_scaled_mm_supports_fp8"}
    assert [c["call"] for c in substituted["calls"]] == ["torch.ops.vllm.mamba_mixer2"]
    assert [p["platform"] for p in substituted["platform"]] == ["TargetCudaPlatform.is_arch_support_pdl"]


def test_every_autotune_candidate_is_in_the_bundle(mamba_build):
    bundle, summary = mamba_build
    tuned = summary["autotune"]
    assert set(tuned) == AUTOTUNED
    assert {k.name for k in archive.read_manifest(bundle).kernels} == AUTOTUNED | PLAIN
    check_candidates_bundled(bundle, tuned)


def test_every_key_the_probe_asks_for_is_a_hit(mamba_build, tmp_path):
    bundle, summary = mamba_build
    events = probe(bundle, tmp_path / "installed", NEMOTRON_H_8B, rounds=12)
    check_probe_hits(events, bundle, AUTOTUNED | PLAIN, summary["autotune"])


def test_the_probe_sees_misses_for_a_state_dtype_not_built(mamba_build, tmp_path):
    """A bf16 SSM state (``--mamba-ssm-cache-dtype bfloat16``) changes the decode kernel's state pointer type, and
    the page size, hence the conv state's block stride."""
    bundle, _ = mamba_build
    events = probe(bundle, tmp_path / "installed", {**NEMOTRON_H_8B, "mamba_ssm_cache_dtype": "bfloat16"}, 2,
                   "decode")
    missed = {e["name"] for e in events if "key" in e and not e["hit"]}
    assert missed == {"_selective_scan_update_kernel", "_causal_conv1d_update_kernel"}


@pytest.mark.parametrize("change", [{"dtype": "float32"}, {"entries": ["chunked"]}, {"tensor_parallel_size": 3},
                                    {"mamba_ssm_cache_dtype": "fp8"}])
def test_bad_arguments_fail_before_anything_is_imported(change):
    from kernelcache.exercise.vllm_mamba import mamba

    modules = set(sys.modules)
    with pytest.raises(ValueError, match="mamba: "):
        mamba(**{**NEMOTRON_H_8B, "max_num_seqs": 2, "max_num_batched_tokens": 4, **change})
    assert not {m for m in set(sys.modules) - modules if m.startswith(("vllm", "torch", "einops"))}


def test_the_bundle_records_the_ssu_table_the_device_name_picked(mamba_build):
    """``selective_state_update``'s block size and warps come from a table named after the device; H100 and H200
    tables differ for Nemotron-H's heads, so the bundle serves the H200 alone (issue 31)."""
    bundle, _ = mamba_build
    keys = archive.read_manifest(bundle).target.device_keys
    tables = {(t.path, t.loader.rsplit(".", 1)[-1], t.file) for t in keys.tables}
    assert tables == {("mamba", "get_ssm_configs",
                       "headdim=64,dstate=128,device_name=NVIDIA_H200,cache_dtype=float32.json")}
    assert (keys.device, keys.serves) == (PRODUCT, {GPU: PRODUCT})


def test_a_profile_run_warmup_that_fails_fails_the_exercise():
    """vLLM catches a failed warmup of the profile run and logs a warning; the exercise raises it instead, since
    a bundle would otherwise lack the kernels a server's profile run compiles (and times)."""
    import logging

    from kernelcache.exercise.vllm_mamba import warmup_failures

    module = "vllm.model_executor.layers.mamba.mamba_mixer2"
    with warmup_failures(module):
        logging.getLogger(module).warning("Mamba2 SSD kernel warmup completed")  # not a failure
        logging.getLogger(module).info("Mamba2 SSD kernel warmup failed for layer x")  # below WARNING
    with pytest.raises(RuntimeError, match="the profile run's warmup failed: Mamba2 SSD kernel warmup failed"), \
            warmup_failures(module):
        try:
            raise ValueError("no memory")
        except ValueError:
            logging.getLogger(module).warning("Mamba2 SSD kernel warmup failed for layer %s", "x", exc_info=True)
