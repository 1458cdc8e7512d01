"""The mrv1_spec_decode path on the CPU: a cross build of vLLM 0.33's V1-runner spec-decode kernels for sm_90.

The bundle must hold every key vLLM's rejection sampler asks for on a random sweep of drafted batches the
exercise never ran (tests/probes/spec_decode_keys.py, against the installed bundle: every call a disk hit),
including the int32 bonus-token keys vLLM's own warmup registry does not compile.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers.common import ROOT, clean_env, kc

from kernelcache.format import archive

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARCH, GPU, SMS, VOCAB, SEQS, SPEC = "sm_90", "h200", 132, 151665, 16, 3
EAGLE = {"eagle_step_slot_mapping_metadata_kernel", "eagle_prepare_inputs_padded_kernel",
         "eagle_prepare_next_token_padded_kernel"}
REJECTION = {"rejection_greedy_sample_kernel", "rejection_random_sample_kernel", "sample_recovered_tokens_kernel",
             "expand_kernel"}


@pytest.fixture(scope="module")
def spec_build(tmp_path_factory, build_cache) -> Path:
    out = tmp_path_factory.mktemp("spec")
    done = kc("build", "--arch", ARCH, "--gpu", GPU, "--vocab", str(VOCAB), "--dtype", "float32",
              "--path", "mrv1_spec_decode", "--num-speculative-tokens", str(SPEC), "--max-num-seqs", str(SEQS),
              "--max-model-len", "4096", "--mode", "cross", "-o", str(out), "--build-cache", str(build_cache), "--json",
              check=True, timeout=1500)
    return Path(json.loads(done.stdout)[0]["bundles"][0]["path"])


def test_bundle_holds_the_rejection_and_eagle_kernels(spec_build):
    data = json.loads(kc("inspect", str(spec_build), "--json", check=True).stdout)
    names = Counter(k["name"] for k in data["kernels"])
    assert set(names) >= REJECTION | EAGLE, names
    # vLLM's registry alone gives 2 greedy and 4 random rejection keys (int64 bonus tokens); the forward
    # path adds the int32 ones the bonus Sampler really returns.
    assert names["rejection_greedy_sample_kernel"] == 4 and names["rejection_random_sample_kernel"] == 6, names
    plan = data["build"]["plan"]
    assert (plan["num_speculative_tokens"], plan["max_model_len"], plan["paths"]) == (SPEC, 4096, ["mrv1_spec_decode"])
    assert set(data["build"]["coverage"]["rejection_greedy_sample_kernel"]["by_path"]) == {"mrv1_spec_decode"}


def test_every_key_the_rejection_sampler_asks_for_is_a_hit(spec_build, tmp_path):
    cache = tmp_path / "installed"
    kc("install", str(spec_build), "--cache-dir", str(cache), check=True)
    probe = subprocess.run([sys.executable, str(ROOT / "tests" / "probes" / "spec_decode_keys.py"),
                            ARCH.removeprefix("sm_"), str(SMS), str(VOCAB), str(SEQS), str(SPEC)],
                           capture_output=True, text=True, timeout=1500, env=clean_env(TRITON_CACHE_DIR=str(cache)))
    assert probe.returncode == 0, probe.stderr[-3000:]
    events = [json.loads(line) for line in probe.stdout.splitlines() if line.startswith("{")]
    assert {e["name"] for e in events} >= REJECTION  # the sweep reached every rejection kernel
    missed = [e for e in events if not e["hit"]]
    assert not missed, missed[:3]
    bundled = {k.key for k in archive.read_manifest(spec_build).kernels}
    assert {e["key"] for e in events} <= bundled


def test_verify_replays_the_spec_decode_plan_with_no_compile(spec_build):
    report = json.loads(kc("verify", str(spec_build), "--json", check=True, timeout=1500).stdout)
    assert report["ok"] and report["compiles"] == 0 and report["hits"] > 0 and report["unexercised"] == []


@pytest.mark.parametrize("args", [["--path", "mrv1_spec_decode"],
                                  ["--path", "mrv1_spec_decode", "--num-speculative-tokens", "0"]])
def test_spec_decode_without_drafts_is_a_usage_error(args, tmp_path):
    done = kc("build", "--arch", ARCH, "--gpu", GPU, "--vocab", str(VOCAB), *args, "-o", str(tmp_path))
    assert done.returncode == 2 and "num_speculative_tokens >= 1" in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())
