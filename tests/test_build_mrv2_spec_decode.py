"""The mrv2_spec_decode exercise on the CPU: a cross build of Model Runner V2's speculative decoding for sm_90.

Built through the Python API as ``kernelcache build --path mrv2_spec_decode --num-speculative-tokens 2`` would
(EAGLE-3, 2 drafts, a small config). The bundle must hold every key MRV2's drafted steps ask for on a random
sweep the exercise never ran (tests/probes/mrv2_spec_decode_keys.py, against the installed bundle: every call
a disk hit), and the probe
must be able to fail: the same sweep for a server with more drafts per request misses, at the grammar
bitmask kernel (structured_outputs.py: ``MASK_STRIDE=k + 1`` is a constexpr). The rejection kernels take
``k + 1`` as a plain int, which Triton specializes only as 1 or a multiple of 16: 3 and 4 share their keys.
The task summary lists what it faked.
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

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARCH, GPU, SMS, VOCAB, SEQS, K, MAX_LEN, TOKENS = "sm_90", "h200", 132, 32000, 4, 2, 512, 256
SPEC = {"_gather_draft_sampled_kernel", "_compute_local_logits_stats_kernel", "_rejection_kernel",
        "_resample_kernel", "_insert_resampled_kernel", "_flatten_sampled_kernel", "_expand_idx_mapping_kernel",
        "_prepare_decode_inputs_kernel", "_update_draft_inputs_kernel", "_get_num_sampled_and_rejected_kernel"}


@pytest.fixture(scope="module")
def build(tmp_path_factory, build_cache) -> tuple[Path, dict]:
    """The bundle and the task's summary, built as users build it (``--path mrv2_spec_decode`` with drafts)."""
    out = tmp_path_factory.mktemp("mrv2spec")
    result = kernelcache.build(ARCH, gpus=[GPU], vocabs=[VOCAB], paths=["mrv2_spec_decode"],
                               dtypes=["bfloat16", "float32"], max_num_seqs=SEQS, num_speculative_tokens=K,
                               max_model_len=MAX_LEN, max_num_batched_tokens=TOKENS, mode="cross",
                               output_dir=out / "bundles", workdir=out / "work", build_cache=str(build_cache))
    (bundle,) = result.bundles
    (job,) = (out / "work").glob(f"*/jobs/{VOCAB}/job.json.result")
    (summary,) = [t["summary"] for t in json.loads(job.read_text())["tasks"] if t["label"] == "mrv2_spec_decode"]
    return Path(bundle.path), summary


def _probe(cache: Path, k: int, rounds: int) -> list[dict]:
    probe = subprocess.run([sys.executable, str(ROOT / "tests" / "probes" / "mrv2_spec_decode_keys.py"),
                            ARCH.removeprefix("sm_"), str(SMS), str(VOCAB), str(SEQS), str(k), str(MAX_LEN),
                            str(TOKENS), str(rounds)],
                           capture_output=True, text=True, timeout=1500, env=clean_env(TRITON_CACHE_DIR=str(cache)))
    assert probe.returncode == 0, probe.stderr[-3000:]
    return [json.loads(line) for line in probe.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def installed(build, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("installed") / "cache"
    kc("install", str(build[0]), "--cache-dir", str(cache), check=True)
    return cache


def test_bundle_holds_the_spec_decode_kernels(build):
    names = {k.name for k in archive.read_manifest(build[0]).kernels}
    assert names >= SPEC, SPEC - names


def test_summary_lists_what_was_faked(build):
    summary = build[1]
    assert {"get_cuda_view_from_cpu_tensor", "is_uva_available"} <= set(summary["c_ops_faked"])
    assert summary["import_fakes"]["ops"][0]["op"] == "_C::cutlass_scaled_mm_supports_block_fp8"
    assert summary["stubbed"] and summary["calls"]["warmup:greedy"] == 1
    assert any(drafted == SEQS for drafted, _, _ in summary["layouts"])


def test_every_key_a_drafted_server_asks_for_is_a_hit(build, installed):
    events = _probe(installed, K, rounds=6)
    assert {e["name"] for e in events} >= SPEC - {"_flatten_sampled_kernel"}
    missed = [e for e in events if not e["hit"]]
    assert not missed, missed[:3]


def test_the_probe_misses_for_a_server_with_more_drafts(installed):
    missed = {e["name"] for e in _probe(installed, K + 1, rounds=1) if not e["hit"]}
    assert "_apply_grammar_bitmask_kernel" in missed, missed
