"""Manifest dataclasses: JSON round trip, schema version, validation of hostile values."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kernelcache.errors import BundleManifestError
from kernelcache.format.manifest import (
    Build,
    Environment,
    FileRecord,
    Kernel,
    Manifest,
    Module,
    Target,
    TritonWalks,
    arch_to_capability,
    walks_member,
    walks_path,
)

pytestmark = pytest.mark.fast

SHA = "0" * 64


def sample() -> Manifest:
    return Manifest(
        target=Target("cuda", "sm_90", 32, gpu="h200", sm_count=132),
        environment=Environment("cp312", "x86_64-linux", "3.6.0", "a" * 64, {"sm_90": "ptxas V12.8.93"},
                                {"TRITON_DEFAULT_FP_FUSION": "true"}, "2.11.0", "0.33.0", None),
        build=Build("kernelcache 0.1.0", "cross", 0, False, {"vocab": [128256]}, {"k": {"n": 2}},
                    ({"path": "tmp.x", "reason": "temporary"},)),
        kernels=(Kernel("k", "K" * 52, 8, 3, (FileRecord("K" * 52 + "/k.cubin", 10, SHA),),
                        {"x": "*fp32", "MASK": "constexpr"}, {"MASK": "-inf"}, {"x": [["tt.divisibility", 16]]}),),
        modules=(Module("launcher", "L" * 52, (FileRecord("L" * 52 + "/l.so", 3, SHA),)),),
    )


def test_round_trip_is_exact():
    m = sample()
    again = Manifest.from_json(m.to_json())
    assert again == m
    assert again.to_json() == m.to_json()


def test_walk_records_round_trip_and_stay_out_of_bundles_without_them():
    record = {"format": 1, "triton_key": "3.8.0-k", "functions": {"m.f": {"src": "s"}}}
    member = walks_member(record)
    assert member == walks_member(json.loads(json.dumps(record)))  # the same record, the same bytes and name
    assert walks_path(member.path) and json.loads(member.data) == record
    walked = dataclasses.replace(sample(), walks=TritonWalks((FileRecord(member.path, len(member.data), SHA),)))
    assert Manifest.from_json(walked.to_json()) == walked
    assert member.path in walked.file_map() and "walks" not in json.loads(sample().to_json())


def test_non_finite_constexpr_becomes_a_string():
    m = sample()
    data = json.loads(m.to_json())
    assert data["kernels"][0]["constexprs"] == {"MASK": "-inf"}
    assert data["format_version"] == 1
    assert list(data)[:3] == ["target", "environment", "build"]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format_version=99), "format_version 99"),
    (lambda d: d.pop("target"), "malformed"),
    (lambda d: d["kernels"][0]["files"][0].update(sha256="xyz"), "sha256"),
    (lambda d: d["kernels"][0]["files"][0].update(size=-1), "size"),
    (lambda d: d["kernels"][0]["files"][0].update(size="10"), "size"),
    (lambda d: d["target"].update(colour="red"), "unknown Target field"),
    (lambda d: d.update(signature="trust me"), "unknown top-level field"),
    (lambda d: d.update(walks={"files": [{"path": "K" * 52 + "/walks.json", "size": 2, "sha256": SHA}]}),
     "not triton-walks/<16 hex digits>/walks.json"),  # a walk record may not land in a kernel's dir
    (lambda d: d.update(walks={"files": []}), "walks lists no file"),
])
def test_bad_manifests_are_refused_with_one_line(mutate, message):
    data = json.loads(sample().to_json())
    mutate(data)
    with pytest.raises(BundleManifestError, match=message) as info:
        Manifest.from_json(json.dumps(data))
    assert "\n" not in str(info.value)


def test_not_json_and_not_an_object():
    with pytest.raises(BundleManifestError, match="not valid JSON"):
        Manifest.from_json(b"\x00{")
    with pytest.raises(BundleManifestError, match="not a JSON object"):
        Manifest.from_json("[1, 2]")


@pytest.mark.parametrize("text, cap", [("sm_90", 90), ("sm_90a", 90), ("sm_100", 100), ("120", 120), ("sm100a", 100)])
def test_arch_parsing(text, cap):
    assert arch_to_capability(text) == cap


def test_arch_parsing_refuses_garbage():
    with pytest.raises(ValueError):
        arch_to_capability("hopper")
