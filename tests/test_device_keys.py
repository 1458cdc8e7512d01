"""Bundles whose kernels the GPU's device name decided install only on the products they serve (issue 31).

vLLM picks its fused-MoE tile configs from a table named after the device (``get_moe_configs``): for Mixtral's
experts (E=8, N=14336, bf16) it ships one for ``NVIDIA_H200`` and none for the H100, so the two profiles, both
sm_90 with 132 SMs, compile different kernels. Real cross builds from a model config for both profiles; real
installs whose GPU check sees a stub driver's GPU (helpers/fakegpu.py); vLLM's own config lookup and the
independent MoE key probe under each device name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import ROOT, clean_env, kc
from helpers.fakegpu import build_stub, env_for

from kernelcache.format import archive
from kernelcache.plan.gpus import PROFILES, VisibleGpu

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

H100, H200 = PROFILES["h100-sxm"], PROFILES["h200"]
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
           "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 32,
           "num_key_value_heads": 8, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
# Experts no tuned table names for either product (E=8, N=64): both get vLLM's default configs.
TINY = {**MIXTRAL, "hidden_size": 256, "intermediate_size": 64}
MAX_M = 4


def model_build(tmp: Path, name: str, config: dict, cache: Path, *gpus: str) -> dict[str, Path]:
    (tmp / name).mkdir()
    (tmp / name / "config.json").write_text(json.dumps(config))
    gpu_flags = [flag for g in gpus for flag in ("--gpu", g)]
    kc("build", "--arch", "sm_90", "--model-config", str(tmp / name / "config.json"), *gpu_flags, "--path", "moe",
       "--max-num-batched-tokens", str(MAX_M), "--mode", "cross", "-o", str(tmp / name / "bundles"), "--build-cache",
       str(cache), check=True, timeout=900)
    return {g: tmp / name / "bundles" / f"{name}-sm_90-{g}.tar.zst" for g in gpus}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, build_cache) -> dict[str, Path]:
    """The Mixtral MoE bundles for h100-sxm and h200, a tiny-expert MoE bundle for h200 and a sampler-only
    bundle for h200 (MRV2's kernels, which depend on the SM count, not the device name)."""
    tmp = tmp_path_factory.mktemp("device-keys")
    mixtral = model_build(tmp, "mixtral", MIXTRAL, build_cache, "h100-sxm", "h200")
    tiny = model_build(tmp, "tiny", TINY, build_cache, "h200")
    kc("build", "--arch", "sm_90", "--gpu", "h200", "--path", "mrv2", "--vocab", "1000", "--dtype", "float32",
       "--max-num-seqs", "2", "--mode", "cross", "-o", str(tmp / "sampler"), "--build-cache", str(build_cache),
       check=True, timeout=900)
    return {"moe-h100-sxm": mixtral["h100-sxm"], "moe-h200": mixtral["h200"], "tiny-h200": tiny["h200"],
            "sampler-h200": tmp / "sampler" / "vllm-sampler-sm_90-h200.tar.zst"}


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Path:
    return build_stub(tmp_path_factory.mktemp("stub-libcuda"))


def install_on(bundle: Path, profile, stub: Path, cache: Path, *extra: str):
    return kc("install", str(bundle), "--cache-dir", str(cache), *extra, env=env_for(stub, profile))


def test_the_manifest_records_the_table_the_device_name_picked(bundles):
    h200 = archive.read_manifest(bundles["moe-h200"]).target.device_keys
    h100 = archive.read_manifest(bundles["moe-h100-sxm"]).target.device_keys
    vllm = Path(importlib.util.find_spec("vllm").origin).parent
    table = vllm / "model_executor/layers/fused_moe/configs/E=8,N=14336,device_name=NVIDIA_H200.json"
    (h200_table,) = h200.tables
    assert (h200.device, h200_table.path, h200_table.file) == (H200.product, "moe", table.name)
    assert h200_table.sha256 == hashlib.sha256(table.read_bytes()).hexdigest()
    (h100_table,) = h100.tables
    assert (h100.device, h100_table.file, h100_table.sha256) == (H100.product, None, None)  # vLLM's default
    assert h100_table.looked_for == "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert h200.serves == {"h200": H200.product} and h100.serves == {"h100-sxm": H100.product}
    # tables that say the same for both products: the bundle serves both, and says so
    tiny = archive.read_manifest(bundles["tiny-h200"]).target.device_keys
    assert tiny.serves == {"h100-sxm": H100.product, "h200": H200.product}
    assert archive.read_manifest(bundles["sampler-h200"]).device_keys is None


def test_install_refuses_the_other_products_moe_bundle(bundles, stub, tmp_path):
    refused = install_on(bundles["moe-h200"], H100, stub, tmp_path / "a")
    assert refused.returncode == 21, refused.stderr
    assert "gpu[0].device" in refused.stdout + refused.stderr and H100.product in refused.stdout + refused.stderr
    assert not (tmp_path / "a").exists() or all(p.name.startswith(".") for p in (tmp_path / "a").iterdir())
    refused = install_on(bundles["moe-h100-sxm"], H200, stub, tmp_path / "b")
    assert refused.returncode == 21, refused.stderr
    for bundle, profile, cache in ((bundles["moe-h200"], H200, "c"), (bundles["moe-h100-sxm"], H100, "d")):
        done = install_on(bundle, profile, stub, tmp_path / cache)
        assert done.returncode == 0, done.stderr


def test_a_bundle_whose_tables_agree_and_a_sampler_bundle_install_on_both(bundles, stub, tmp_path):
    for name in ("tiny-h200", "sampler-h200"):
        for profile in (H100, H200):
            done = install_on(bundles[name], profile, stub, tmp_path / f"{name}-{profile.name}")
            assert done.returncode == 0, (name, profile.name, done.stderr)


def test_explicit_gpu_refuses_a_bundle_that_does_not_serve_it(bundles, tmp_path):
    done = kc("install", str(bundles["moe-h200"]), "--cache-dir", str(tmp_path / "a"), "--gpu", "h100-sxm",
              env={"KERNELCACHE_NO_GPU_PROBE": "1"})
    assert done.returncode == 21, done.stderr
    assert kc("install", str(bundles["tiny-h200"]), "--cache-dir", str(tmp_path / "b"), "--gpu", "h100-sxm",
              env={"KERNELCACHE_NO_GPU_PROBE": "1"}).returncode == 0


def test_a_bundle_built_before_the_record_is_refused_by_its_plan(bundles, stub, tmp_path):
    """A moe bundle from before device_keys existed: its plan's moe path and profile decide."""
    from helpers.bundles import rewrite

    old = rewrite(bundles["moe-h200"], tmp_path / "old.tar.zst", target={"device_keys": None})
    assert "device_keys" not in archive.read_manifest(old).to_dict()["target"]
    assert install_on(old, H100, stub, tmp_path / "a").returncode == 21
    assert install_on(old, H200, stub, tmp_path / "b").returncode == 0


def test_verify_counts_a_device_name_mismatch_as_misses(bundles, tmp_path):
    done = kc("verify", str(bundles["moe-h200"]), "--gpu", "h100-sxm", "--json", timeout=900)
    assert done.returncode == 50, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["compiles"] > 0 and H100.product in report["device"]
    done = kc("verify", str(bundles["moe-h200"]), "--json", timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["device"] is None


def test_an_independent_probe_sees_other_keys_under_the_other_device_name(bundles, tmp_path):
    """vLLM's own ``try_get_optimal_moe_config`` gives other tile configs for the two names, and the MoE key
    probe (tests/probes/moe_keys.py) against the installed h200 bundle hits every key as an H200 and misses as
    an H100."""
    assert moe_configs(H100.product) != moe_configs(H200.product)
    cache = tmp_path / "cache"
    kc("install", str(bundles["moe-h200"]), "--cache-dir", str(cache), check=True)
    dims = [str(v) for v in (8, 4096, 14336, 2, "bfloat16", MAX_M)]
    seen = {}
    for profile in (H200, H100):
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "probes" / "moe_keys.py"), "90", "132",
                               profile.product, *dims, "1", "2", "3", "4"], capture_output=True, text=True,
                              timeout=900, env=clean_env(TRITON_CACHE_DIR=str(cache)))
        assert done.returncode == 0, done.stderr[-3000:]
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        # the build's moe path runs the layer as models build it; the probe's functional entry is another API
        seen[profile.name] = {(r["key"], r["hit"]) for r in rows
                              if r["name"] == "fused_moe_kernel" and r["entry"] == "layer"}
    assert seen["h200"] and all(hit for _, hit in seen["h200"])
    assert any(not hit for _, hit in seen["h100-sxm"])


PROBE = r"""
import json, sys
import vllm.platforms
from vllm.platforms import interface
class P(interface.Platform):
    _enum = interface.PlatformEnum.CUDA
    device_type = "cuda"
    @classmethod
    def get_device_name(cls, device_id=0):
        return sys.argv[1]
    @classmethod
    def get_device_capability(cls, device_id=0):
        return interface.DeviceCapability(9, 0)
vllm.platforms._current_platform = P()
from kernelcache.exercise import fake_ops  # the C ops fused_moe's imports call, as the probes stand them in
fake_ops.install()
from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config
w1, w2 = (8, 2 * 14336, 4096), (8, 4096, 14336)
print(json.dumps([try_get_optimal_moe_config(w1, w2, 2, None, m) for m in (1, 2, 4, 64, 1024)]))
"""


def moe_configs(device: str) -> list:
    done = subprocess.run([sys.executable, "-c", PROBE, device], capture_output=True, text=True, timeout=300,
                          env=clean_env(CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_index_annotation_carries_what_a_bundle_serves(bundles):
    """What ``push`` writes on each index entry is what selection reads back (remote/oci.py)."""
    from kernelcache.remote import oci
    from kernelcache.remote.select import choose

    candidates = [oci._candidate({"annotations": oci.annotations(archive.read_manifest(bundles[name])),
                                  "digest": name}) for name in ("moe-h200", "moe-h100-sxm", "sampler-h200")]
    assert [c.serves for c in candidates] == [(H200.product,), (H100.product,), None]
    sxm = VisibleGpu(0, H100.product, 90, 132)
    assert choose(candidates[:2], [sxm]).reference == "moe-h100-sxm"
    assert choose(candidates[:1] + candidates[2:], [sxm]).reference == "sampler-h200"
