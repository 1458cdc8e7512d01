"""Picking the bundle for this machine out of an index: a pure function of GPUs and candidates."""

from __future__ import annotations

import pytest

from kernelcache.errors import ArchMismatch, UsageError
from kernelcache.plan.gpus import VisibleGpu
from kernelcache.remote.select import Candidate, choose

pytestmark = pytest.mark.fast

H200 = VisibleGpu(0, "NVIDIA H200", 90, 132)
H100_PCIE = VisibleGpu(0, "NVIDIA H100 PCIe", 90, 114)
B200 = VisibleGpu(0, "NVIDIA B200", 100, 148)
A100 = VisibleGpu(0, "NVIDIA A100-SXM4-80GB", 80, 108)

X86 = "x86_64-linux"
ARM = "aarch64-linux"
INDEX = [
    Candidate("sm_90", "h200", 132, X86, "sha256:h200"),
    Candidate("sm_90", "h100-pcie", 114, X86, "sha256:h100pcie"),
    Candidate("sm_90", "h200", 132, ARM, "sha256:gh200"),
    Candidate("sm_100", None, None, X86, "sha256:sm100"),
]


def pick(gpus, **kw):
    return choose(INDEX, gpus, platform=kw.pop("platform", X86), **kw).reference


def test_the_visible_gpu_picks_its_exact_bundle():
    assert pick([H200]) == "sha256:h200"
    assert pick([H100_PCIE]) == "sha256:h100pcie"
    assert pick([H200, VisibleGpu(1, "NVIDIA H200", 90, 132)]) == "sha256:h200"


def test_platform_decides_between_equal_gpus():
    assert pick([H200], platform=ARM) == "sha256:gh200"


def test_an_arch_only_bundle_serves_every_gpu_of_that_arch():
    assert pick([B200]) == "sha256:sm100"
    assert pick([], arch="sm_100") == "sha256:sm100"
    assert pick([], gpu="b200") == "sha256:sm100"


def test_explicit_gpu_overrides_the_visible_one():
    assert pick([B200], gpu="h100-pcie") == "sha256:h100pcie"
    assert pick([], gpu="h200") == "sha256:h200"


def test_a_profile_with_the_same_sm_count_is_taken_by_name_first():
    both = [Candidate("sm_90", "h100-sxm", 132, None, "sha256:sxm"), Candidate("sm_90", "h200", 132, None, "sha256:h")]
    assert choose(both, [], gpu="h200").reference == "sha256:h"
    assert choose(both, [], gpu="h100-sxm").reference == "sha256:sxm"
    assert choose(both, [H200]).reference == "sha256:h"


def test_no_bundle_for_the_gpu_is_refused_with_what_the_index_has():
    with pytest.raises(ArchMismatch) as caught:
        pick([A100])
    assert "sm_80" in str(caught.value) and "sm_90 (h200" in caught.value.differences[0][1]
    with pytest.raises(ArchMismatch):
        choose([Candidate("sm_90", "h200", 132)], [H100_PCIE])  # 114 SMs: the split kernels would miss
    with pytest.raises(ArchMismatch):
        pick([], gpu="h100-pcie", platform=ARM)


def test_ambiguous_or_impossible_requests_are_usage_errors():
    with pytest.raises(UsageError, match="no GPU is visible"):
        pick([])
    with pytest.raises(UsageError, match="different kinds"):
        pick([H200, VisibleGpu(1, "NVIDIA B200", 100, 148)])
    with pytest.raises(UsageError, match="several bundles for sm_90"):
        pick([], arch="sm_90")
    with pytest.raises(UsageError, match="contradicts"):
        pick([], arch="sm_100", gpu="h200")
    with pytest.raises(UsageError, match="unknown GPU profile"):
        pick([], gpu="tpu-v5")
    with pytest.raises(UsageError, match="not a CUDA arch"):
        pick([], arch="ampere")


def test_arch_alone_takes_the_only_bundle_of_that_arch():
    only = [Candidate("sm_90", "h200", 132, None, "sha256:h")]
    assert choose(only, [], arch="sm_90").reference == "sha256:h"


SXM = VisibleGpu(0, "NVIDIA H100 80GB HBM3", 90, 132)


def test_a_device_keyed_bundle_is_picked_only_for_the_products_it_serves():
    """MoE bundles (a ``serves`` note): an H100 never gets the h200 bundle, even as the only one of its SM count."""
    moe = [Candidate("sm_90", "h200", 132, None, "sha256:h200", serves=("NVIDIA H200",)),
           Candidate("sm_90", "h100-sxm", 132, None, "sha256:sxm", serves=("NVIDIA H100 80GB HBM3",))]
    assert choose(moe, [SXM]).reference == "sha256:sxm"
    assert choose(moe, [H200]).reference == "sha256:h200"
    assert choose(moe, [], gpu="h100-sxm").reference == "sha256:sxm"
    with pytest.raises(ArchMismatch, match="NVIDIA H100 80GB HBM3"):
        choose(moe[:1], [SXM])
    with pytest.raises(ArchMismatch):
        choose(moe[:1], [], gpu="h100-sxm")
    both = [Candidate("sm_90", "h200", 132, None, "sha256:both", serves=("NVIDIA H100 80GB HBM3", "NVIDIA H200"))]
    assert choose(both, [SXM]).reference == "sha256:both"
    # a sampler bundle (no note) still serves every product of its SM count
    assert choose([Candidate("sm_90", "h200", 132, None, "sha256:s")], [SXM]).reference == "sha256:s"
