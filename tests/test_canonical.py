"""The fast canonical form (format/canonical.py) is byte for byte the standard library's, so digests never move."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import random
from collections import OrderedDict
from pathlib import Path

import pytest

from kernelcache.errors import BundleManifestError
from kernelcache.format import archive, canonical
from kernelcache.format.manifest import (
    Build,
    DeviceKeys,
    DeviceTable,
    Environment,
    FileRecord,
    FlashInferModule,
    Kernel,
    Manifest,
    Module,
    Target,
    TritonIdentity,
    TritonWalks,
    Tuning,
    _plain,
)

SHA = "0123456789abcdef" * 4


def old_data(manifest: Manifest) -> dict:
    """What ``Manifest.to_dict`` gave before format/canonical.py: asdict, then _plain."""
    data = _plain(dataclasses.asdict(manifest))
    if manifest.triton_identity is None:
        del data["triton_identity"]
    if manifest.target.device_keys is None:  # bundles whose kernels no device name decided keep their bytes
        del data["target"]["device_keys"]
    if manifest.tuning is None:  # likewise bundles nobody tuned
        del data["tuning"]
    if manifest.walks is None:  # likewise bundles without walk records
        del data["walks"]
    if manifest.engine is None:  # likewise bundles without the engine's compile artifact
        del data["engine"]
    for module in data["flashinfer"]:  # likewise FlashInfer modules built without a record of their sources
        if module["sources_sha256"] is None:
            del module["sources"], module["sources_sha256"]
    return data


def old_canonical(manifest: Manifest) -> bytes:
    """The canonical form as the digest was defined before format/canonical.py."""
    return (json.dumps(old_data(manifest), indent=1, allow_nan=False) + "\n").encode()


def same(a: object, b: object) -> bool:
    """Equal, with the same key order and the same types throughout (== alone ignores both)."""
    return a == b and json.dumps(a) == json.dumps(b) and repr(a) == repr(b)


class Colour(enum.IntEnum):
    RED = 1


def manifests() -> list[Manifest]:
    """Manifests with every kind of value a manifest can hold, including the ones the fast path leaves alone."""
    def kernel(name: str, constexprs: dict | None, attrs: dict | None, signature: dict | None = None) -> Kernel:
        key = (name.upper() * 52)[:52]
        files = (FileRecord(f"{key}/{name}.json", 10, SHA), FileRecord(f"{key}/__grp__{name}.json", 0, SHA))
        return Kernel(name, key, 4, 3, files, signature, constexprs, attrs)

    divisible = {"x": [["tt.divisibility", 16]], "y": [["tt.divisibility", 16], ["tt.equal_to", 1]]}
    base = Manifest(
        target=Target("cuda", "sm_90", 32, gpu="h200", sm_count=132),
        environment=Environment("cp312", "x86_64-linux", "3.6.0", "a" * 64,
                                {"sm_90": "ptxas: NVIDIA (R)\nV12.8.93\n", "sm_100": "é \u2028 \"q\" \\ \t"},
                                {"TRITON_DEFAULT_FP_FUSION": "true"}, "2.11.0", "0.33.0", None),
        build=Build("kernelcache 0.1.0", "cross", 1700000000, True,
                    {"name": "p", "vocabs": [{"size": 128256, "models": ["Llama", "ü"]}], "empty": {}, "none": [],
                     "nested": [[[], {}], [[1, [2, [3]]]]], "f": 0.1, "big": 10**30, "neg": -5},
                    {"k": {"n": 2, "ratio": 1e-300, "l": [1.5, True, None]}},
                    ({"path": "tmp.x", "reason": "temporary"}, {})),
        kernels=(kernel("a", {"MASK": -math.inf, "N": 1024, "F": 0.5, "B": True, "S": "s", "Z": None,
                              "T": (1, 2, (3, math.nan)), "L": []},
                        divisible, {"x": "*fp32", "MASK": "constexpr"}),
                 kernel("b", None, None),
                 kernel("c", {}, {}, {}),
                 kernel("d", {"N": 1}, dict(divisible), {"x": "*fp16"}),
                 kernel("e", {"N": 1}, {"x": [["tt.divisibility", 16]], "y": {"odd": [1]}})),
        modules=(Module("launcher", "L" * 52, (FileRecord("L" * 52 + "/l.so", 3, SHA),)),),
        flashinfer=(FlashInferModule("sampling", "0.7.2", "12.8", ("sm90a",), None,
                                     (FileRecord("flashinfer/x/sampling/sampling.so", 7, SHA),)),),
    )
    identity = TritonIdentity({"libtriton.so": "size:1 build-id:ab", "a.py": "sha256:" + SHA}, "key", ("TRITON_X",),
                              {"sm_90": "backends/nvidia/bin/ptxas"})
    unusual = [  # values outside the fast path: the standard library's path gives the canonical form
        dataclasses.replace(base.kernels[0], constexprs={"N": Colour.RED}),
        dataclasses.replace(base.kernels[0], constexprs={"P": Path("/x")}),
        dataclasses.replace(base.kernels[0], constexprs=OrderedDict(N=1)),
        dataclasses.replace(base.kernels[0], constexprs={"N": True, 3: "int key"}),
        dataclasses.replace(base.kernels[0], constexprs={"S": type("Text", (str,), {})("sub")}),
    ]
    keys = DeviceKeys("NVIDIA H200", (DeviceTable("moe", "vllm.x.get_moe_configs", "E=8.json", "E=8.json", SHA, SHA),
                                      DeviceTable("mamba", None, "h.json", None, None)),
                      {"h100-sxm": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"})
    device_keyed = dataclasses.replace(base, target=dataclasses.replace(base.target, device_keys=keys))
    tuned = dataclasses.replace(base, tuning=Tuning("NVIDIA H200", "580.159.04", None, {"max_sm": 1980, "sm": 1755},
                                                    (FileRecord("T" * 52 + "/k.autotune.json", 9, SHA),)))
    walked = dataclasses.replace(base, walks=TritonWalks((FileRecord("triton-walks/" + SHA[:16] + "/walks.json", 9,
                                                                    SHA),)))
    return [base, dataclasses.replace(base, triton_identity=identity), Manifest(base.target, base.environment,
                                                                               base.build), device_keyed, tuned,
            walked] + [
        dataclasses.replace(base, kernels=(k,)) for k in unusual]


@pytest.mark.fast
@pytest.mark.parametrize("index", range(len(manifests())))
def test_the_canonical_form_is_the_standard_librarys(index):
    manifest = manifests()[index]
    assert same(manifest.to_dict(), old_data(manifest))
    assert manifest.to_json() == old_canonical(manifest)
    assert archive.bundle_digest(manifest) == hashlib.sha256(old_canonical(manifest)).hexdigest()


@pytest.mark.fast
def test_values_outside_the_fast_path_say_so():
    for value in ({"N": Colour.RED}, {1: "a"}, OrderedDict(a=1), [math.inf], {"x": [Path("/")]}, b"x"):
        with pytest.raises(canonical.Unusual):
            canonical.dumps(value)
    for value in (Colour.RED, {1: "a"}, OrderedDict(a=1), Path("/"), b"x"):
        with pytest.raises(canonical.Unusual):
            canonical.plain(value)


def random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 5 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randrange(-10**6, 10**6) * rng.choice([1, 10**20])
    if kind == 2:
        return rng.uniform(-1e6, 1e6) * rng.choice([1, 1e-300, 1e300])
    if kind in (3, 4, 5):
        return "".join(rng.choice('ab ,:[]{}"\\\n\té\u2028\U0001f600/') for _ in range(rng.randrange(6)))
    if kind in (6, 7):
        keys = ["".join(rng.choice("xyz,: ]") for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(5))]
        return {k: random_value(rng, depth + 1) for k in keys}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(5))]


@pytest.mark.fast
def test_dumps_is_json_dumps_indent_1_on_random_data():
    rng = random.Random(20240611)
    for _ in range(3000):
        value = random_value(rng)
        # repeated containers at other depths exercise the memo of dicts of lists
        data = {"a": value, "b": [value, {"c": value}], "d": {"e": [[value]]}}
        assert canonical.dumps(data) == json.dumps(data, indent=1, allow_nan=False)


def test_a_real_bundles_manifest_is_canonical_and_its_digest_unchanged(bundle90):
    manifest, member = archive.read_manifest_member(bundle90)
    assert member == old_canonical(manifest) == manifest.to_json()  # archive.write stores the canonical form
    assert same(manifest.to_dict(), old_data(manifest))
    assert archive.bundle_digest(manifest) == hashlib.sha256(member).hexdigest()


@pytest.mark.fast
def test_device_keys_round_trip_and_malformed_ones_are_refused():
    keyed = manifests()[3]
    assert keyed.target.device_keys is not None
    assert Manifest.from_json(keyed.to_json()).target == keyed.target  # (its constexprs hold a NaN and tuples)
    data = json.loads(keyed.to_json())
    data["target"]["device_keys"]["serves"] = {"h200": 7}
    with pytest.raises(BundleManifestError):
        Manifest.from_dict(data)
    data["target"]["device_keys"] = {"device": "x", "tables": [{"path": "moe"}], "serves": {}}
    with pytest.raises(BundleManifestError):
        Manifest.from_dict(data)
