"""`kernelcache build` on the CPU: a cross build of vLLM 0.33's sampler for sm_90 and sm_100.

The bundle's keys must equal, key for key, what vLLM's own registry and the seeded MRV1/MRV2 paths
ask for under the same fake target -- computed independently by tests/probes/vllm_keys.py against
the installed bundle (so every one of those calls must also be a disk hit).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import ROOT, clean_env, kc

from kernelcache.format import archive

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_NUM_SEQS = 256
REGISTRY = {"_topk_topp_kernel": 12, "_topp_sb_stats_kernel": 8, "_topp_sb_step_kernel": 16, "_topp_sb_mask_kernel": 8}


# 151665 (Qwen2.5's tokenizer) is odd: a single padded row's stride (151680) and the vocab fall in different
# Triton specialization classes, which is where a fake target that gets layouts wrong asks for the wrong key.
TARGETS = {"sm_90": ("sm_90", "h200", 132, 151665), "sm_100": ("sm_100", "b200", 148, 128256)}


@pytest.fixture(scope="module")
def builds(tmp_path_factory, build_cache):
    """One cross build per arch, made on first use and shared by every test of the module."""
    made = {}

    def get(arch: str):
        if arch not in made:
            _, gpu, sms, vocab = TARGETS[arch]
            result = build_once(arch, gpu, vocab, tmp_path_factory.mktemp(f"build-{arch}"), build_cache)
            made[arch] = (arch, gpu, sms, vocab, Path(result[0]["bundles"][0]["path"]), result[0])
        return made[arch]

    return get


@pytest.fixture(scope="module", params=list(TARGETS))
def cross_build(request, builds):
    return builds(request.param)


def build_once(arch: str, gpu: str, vocab: int, out: Path, cache: Path) -> dict:
    done = kc("build", "--arch", arch, "--gpu", gpu, "--vocab", str(vocab), "--dtype", "float32", "--path", "registry",
              "--path", "mrv1", "--path", "mrv2", "--mode", "cross", "-o", str(out), "--build-cache", str(cache),
              "--json", check=True, timeout=1200)
    return json.loads(done.stdout)


def small_build(out: Path, *extra: str) -> tuple[Path, dict]:
    """MRV2's sampler for 4 sequences on sm_90: (its bundle, the build's JSON)."""
    done = kc("build", "--arch", "sm_90", "--gpu", "h200", "--vocab", "151665", "--dtype", "float32", "--path", "mrv2",
              "--max-num-seqs", "4", "--mode", "cross", "-o", str(out), "--json", *extra, check=True, timeout=1200)
    [result] = json.loads(done.stdout)
    return Path(result["bundles"][0]["path"]), result


@pytest.fixture(scope="module")
def small(tmp_path_factory, build_cache) -> Path:
    """A small vLLM bundle (``small_build``), built with the session's build cache (the 3-path sm_90 build takes its
    27 kernels from there): the first of test_the_same_build_twice's builds, and what a test that needs some bundle
    of vLLM's kernels and gcc-built modules reads."""
    return small_build(tmp_path_factory.mktemp("small"), "--build-cache", str(build_cache))[0]


def test_the_same_build_twice_gives_the_same_bytes(small, tmp_path):
    # A small build is enough: what makes bytes reproducible (archive order, mtimes, build.reproducible_cc for the
    # gcc-built launchers and cuda_utils) does not depend on the target or the number of kernels, and rebuilding
    # the module's whole build would cost CI four more minutes.
    # The second build compiles everything (no build cache) and signs its bundle inline (build --sign): the signature
    # sits beside it, the bytes are the same.
    from helpers.keys import write_pair

    from kernelcache.bundle.signature import signature_info

    key, public, fingerprint = write_pair(tmp_path, "ci")
    signed, result = small_build(tmp_path / "second", "--no-build-cache", "--sign", str(key))
    modules = {m.kind for m in archive.read_manifest(small).modules}
    assert "cuda_utils" in modules  # a gcc-built module is among the bytes compared
    assert signed.read_bytes() == small.read_bytes()
    assert result["signatures"][0]["signer"] == fingerprint
    assert signature_info(signed, (str(public),)).status == "trusted"
    assert signature_info(small).status == "unsigned"


def test_build_lists_every_registry_variant(cross_build):
    arch, gpu, sms, vocab, bundle, result = cross_build
    data = json.loads(kc("inspect", str(bundle), "--json", check=True).stdout)
    names = [k["name"] for k in data["kernels"]]
    for kernel, count in REGISTRY.items():
        assert names.count(kernel) == count, (kernel, names.count(kernel))
    assert names.count("_gumbel_sample_kernel") >= 1
    assert data["target"] == {"backend": "cuda", "arch": arch, "warp_size": 32, "gpu": gpu, "sm_count": sms}
    assert data["environment"]["vllm"] == "0.33.0"
    assert data["build"]["mode"] == "cross" and [v["size"] for v in data["build"]["plan"]["vocabs"]] == [vocab]
    coverage = data["build"]["coverage"]
    assert coverage["_topk_topp_kernel"]["by_path"]["registry"] == 12
    assert 0 < coverage["_topk_topp_kernel"]["by_path"]["mrv1"] <= 12
    import triton

    per_kernel_launchers = tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7)
    expected = {"launcher", "cuda_utils"} if per_kernel_launchers else {"cuda_utils"}
    assert {m["kind"] for m in data["modules"]} == expected


def test_keys_equal_what_vllm_itself_asks_for(cross_build, tmp_path):
    arch, gpu, sms, vocab, bundle, _ = cross_build
    cache = tmp_path / "installed"
    kc("install", str(bundle), "--cache-dir", str(cache), check=True)
    capability = arch.removeprefix("sm_")
    probe = subprocess.run([sys.executable, str(ROOT / "tests" / "probes" / "vllm_keys.py"), capability, str(sms),
                            str(vocab), str(MAX_NUM_SEQS)], capture_output=True, text=True, timeout=1200,
                           env=clean_env(TRITON_CACHE_DIR=str(cache)))
    assert probe.returncode == 0, probe.stderr[-3000:]
    events = [json.loads(line) for line in probe.stdout.splitlines() if line.startswith("{")]
    bundled = {k.key for k in archive.read_manifest(bundle).kernels}
    asked = {e["key"] for e in events}
    assert asked == bundled, (sorted(asked - bundled), sorted(bundled - asked))
    assert all(e["hit"] for e in events), [e for e in events if not e["hit"]][:3]


def test_cubins_are_elf_for_the_target(cross_build, tmp_path):
    arch, _, _, _, bundle, _ = cross_build
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    cubins = [(name, data) for _, name, data in archive.iter_members(bundle) if name.endswith(".cubin")]
    assert cubins
    for name, data in cubins[:6]:
        assert data[:4] == b"\x7fELF"
        path = tmp_path / Path(name).name
        path.write_bytes(data)
        listing = subprocess.run([str(cuobjdump), "-lelf", str(path)], capture_output=True, text=True).stdout
        assert f".{arch}a.cubin" in listing, listing


def test_missing_path_is_named(tmp_path):
    stub = tmp_path / "site" / "vllm"
    (stub / "v1" / "sample").mkdir(parents=True)
    for init in (stub, stub / "v1", stub / "v1" / "sample"):
        (init / "__init__.py").write_text("")
    (stub / "v1" / "sample" / "sampler.py").write_text("")
    dist = tmp_path / "site" / "vllm-0.33.0.dist-info"  # a supported release, so the release check passes it
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    done = kc("build", "--arch", "sm_90", "--gpu", "h200", "--path", "mrv2",
              env={"PYTHONPATH": str(tmp_path / "site")})
    # the release check reads each contact point's module on disk: the Gumbel sampler's is not in this vLLM
    assert done.returncode == 36 and "mrv2" in done.stderr and "gumbel" in done.stderr, done.stderr


def test_verify_without_file_takes_every_helper_module_from_the_bundle(small, tmp_path):
    """Without file(1), Triton 3.6 keys every launcher and cuda_utils differently from the build (platform_key()):
    each is taken from the bundle (hooks/kernelcache_prebuilt.py), none built with gcc. (Under Triton 3.8
    only cuda_utils is a module, and its key differs anyway: the same holds.)"""
    from test_prebuilt_helpers import no_file_path

    bundle = small
    done = kc("verify", str(bundle), "--json", env={"PATH": no_file_path(tmp_path)}, check=True)
    report = json.loads(done.stdout)
    assert report["ok"] and report["compiles"] == 0 and report["gcc_builds"] == [] and report["files_written"] == []
    modules = archive.read_manifest(bundle).modules
    copied = [f for f in report["tolerated"] if "/" in f]
    assert len(copied) == len(modules) and not {f.split("/")[0] for f in copied} & {m.key for m in modules}


def test_verify_counts_hits_and_fails_on_a_missing_kernel(cross_build, tmp_path):
    arch, _, _, _, bundle, _ = cross_build
    report = json.loads(kc("verify", str(bundle), "--json", check=True).stdout)
    assert report["ok"] and report["compiles"] == 0 and report["hits"] > 40 and report["mode"] == "cross"
    assert report["gcc_builds"] == [] and report["files_written"] == []
    assert all("cuda_utils" in t for t in report["tolerated"])
    assert report["unexercised"] == [] and report["tasks"] == 3  # every bundled kernel was asked for

    cache = tmp_path / "c"
    kc("install", str(bundle), "--cache-dir", str(cache), check=True)
    gumbel = next(k for k in archive.read_manifest(bundle).kernels if k.name == "_gumbel_sample_kernel")
    import shutil

    shutil.rmtree(cache / gumbel.key)
    done = kc("verify", "--cache-dir", str(cache), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 50 and not report["ok"]
    assert report["compiles"] >= 1 and any(gumbel.key in f for f in report["files_written"])
    assert {k["name"]: k["compiles"] for k in report["kernels"]}["_gumbel_sample_kernel"] >= 1
