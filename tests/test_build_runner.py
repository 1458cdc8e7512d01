"""The runner exercise on the CPU: a cross build of Model Runner V2's own Triton kernels for sm_90.

Built through the Python API with the ``runner`` task as an extra task (the recipe's own paths select no
sampler task: the registry path with bf16 logits runs nothing). The bundle must hold every key MRV2's
input preparation, block tables and sampler ask for on a random sweep of batches the exercise never ran
(tests/probes/runner_keys.py, against the installed bundle: every call a disk hit), and the probe must be
able to fail: the same sweep for a server with more sequences (a max_num_seqs % 16 class the build did not
see) misses.
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

ARCH, GPU, SMS, VOCAB, SEQS, MAX_LEN, TOKENS = "sm_90", "h200", 132, 151665, 8, 1024, 512
RUNNER = {"_prepare_prefill_inputs_kernel", "_prepare_pos_seq_lens_kernel", "_combine_sampled_and_draft_tokens_kernel",
          "_get_num_sampled_and_rejected_kernel", "_post_update_kernel", "_gather_block_tables_kernel",
          "_compute_slot_mappings_kernel", "_apply_write_kernel"}
SAMPLER = {"_penalties_kernel", "_bincount_kernel", "_bias_kernel", "_bad_words_kernel", "_temperature_kernel",
           "_min_p_kernel", "_topk_log_softmax_kernel", "_ranks_kernel", "_prompt_logprobs_token_ids_kernel",
           "_apply_grammar_bitmask_kernel", "_gumbel_sample_kernel", "_topk_topp_kernel"}


@pytest.fixture(scope="module")
def runner_build(tmp_path_factory, build_cache) -> Path:
    out = tmp_path_factory.mktemp("runner")
    task = Task("kernelcache.exercise.vllm_runner:runner", {
        "vocab": VOCAB, "max_num_seqs": SEQS, "max_model_len": MAX_LEN, "max_num_batched_tokens": TOKENS,
        "dtypes": ["bfloat16", "float32"]}, label="runner")
    result = kernelcache.build(ARCH, gpus=[GPU], vocabs=[VOCAB], paths=["registry"], dtypes=["bfloat16"],
                               max_num_seqs=SEQS, mode="cross", extra_tasks=(task,), output_dir=out,
                               build_cache=str(build_cache))
    (bundle,) = result.bundles
    return bundle.path


def _probe(cache: Path, seqs: int, rounds: int) -> list[dict]:
    probe = subprocess.run([sys.executable, str(ROOT / "tests" / "probes" / "runner_keys.py"), ARCH.removeprefix("sm_"),
                            str(SMS), str(VOCAB), str(seqs), str(MAX_LEN), str(TOKENS), str(rounds)],
                           capture_output=True, text=True, timeout=1500, env=clean_env(TRITON_CACHE_DIR=str(cache)))
    assert probe.returncode == 0, probe.stderr[-3000:]
    return [json.loads(line) for line in probe.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def installed(runner_build, tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("installed") / "cache"
    kc("install", str(runner_build), "--cache-dir", str(cache), check=True)
    return cache


def test_bundle_holds_the_runner_and_sampler_kernels(runner_build):
    names = {k.name for k in archive.read_manifest(runner_build).kernels}
    assert names >= RUNNER | SAMPLER, (RUNNER | SAMPLER) - names


def test_every_key_the_runner_asks_for_is_a_hit(runner_build, installed):
    events = _probe(installed, SEQS, rounds=10)
    assert {e["name"] for e in events} >= RUNNER | (SAMPLER - {"_apply_write_kernel"})
    missed = [e for e in events if not e["hit"]]
    assert not missed, missed[:3]
    assert {e["key"] for e in events} <= {k.key for k in archive.read_manifest(runner_build).kernels}


def test_the_probe_misses_for_a_server_with_more_sequences(installed):
    # max_num_seqs reaches _prepare_pos_seq_lens_kernel as an int (8: no class; 16: % 16), and the strides
    # of the per-request buffers: a bundle built for 8 sequences cannot serve 16.
    missed = {e["name"] for e in _probe(installed, 2 * SEQS, rounds=1) if not e["hit"]}
    assert "_prepare_pos_seq_lens_kernel" in missed, missed
