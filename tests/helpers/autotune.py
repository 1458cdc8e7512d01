"""What the families with autotuned kernels (mamba's SSD kernels, gdn's FLA chunk kernels) must show: every candidate
config in the bundle, and an independent probe's every key a hit, every candidate it benchmarked one the build ran.
Candidates are labelled as the exercises and the probes label them: the config's meta-parameters, ``num_warps`` and
``num_stages`` as sorted JSON."""

from __future__ import annotations

import json
from pathlib import Path

from kernelcache.format import archive


def config_of(kernel, names: set[str]) -> str:
    """A bundled kernel's candidate config, labelled as the exercise and the probe label theirs."""
    meta = {k: v for k, v in (kernel.constexprs or {}).items() if k in names}
    return json.dumps({**meta, "num_warps": kernel.num_warps, "num_stages": kernel.num_stages}, sort_keys=True)


def check_candidates_bundled(bundle: Path, tuned: dict) -> None:
    """Each autotuned kernel of the task's summary: every config compiled (no pruning), and the bundle's
    variants of it are exactly those candidates."""
    kernels = archive.read_manifest(bundle).kernels
    assert not [f.path for k in kernels for f in k.files if f.path.endswith(".autotune.json")]
    for name, seen in tuned.items():
        assert len(seen["candidates"]) == seen["configs"] and not seen["pruned_by"], name
        names = set().union(*(json.loads(c) for c in seen["candidates"])) - {"num_warps", "num_stages"}
        assert {config_of(k, names) for k in kernels if k.name == name} == set(seen["candidates"]), name


def check_probe_hits(events: list[dict], bundle: Path, names: set[str], tuned: dict) -> None:
    """The probe's compiles over the engine's profile run and decode, prefill and mixed batches: the kernels
    ``names``, every one a disk hit of a bundled key; the candidates it benchmarked are the build's."""
    compiles = [e for e in events if "key" in e]
    assert {e["entry"] for e in compiles} == {"profile", "decode", "prefill", "mixed"}
    assert {e["name"] for e in compiles} == names
    missed = [e for e in compiles if not e["hit"]]
    assert not missed, missed[:3]
    assert {e["key"] for e in compiles} <= {k.key for k in archive.read_manifest(bundle).kernels}
    seen = {(e["candidate"], e["config"]) for e in events if "candidate" in e}
    assert seen == {(name, c) for name, t in tuned.items() for c in t["candidates"]}
