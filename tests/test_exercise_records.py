"""Exercise records (issue 27): a build keeps what each exercise process produced under a key of everything it read,
and a later build (or another product's target of the same build) takes it instead of running that process.

Real builds for a fake sm_90 with a real build-cache directory: kernelcache's test kernels (cheap) and, marked
slow, vLLM's MRV2 sampler and fused-MoE layer. A restored unit leaves no worker log in its job dir, which is how
these tests tell that its process did not run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.common import ROOT
from helpers.testkernel_builds import FLAGS, build, filled

import kernelcache
from kernelcache.buildcache import blob as blobs
from kernelcache.buildcache.exercises import KEYS, LOG, RESULT, UnitUse, restore, stack_inputs, unit_key
from kernelcache.buildcache.store import DirStore
from kernelcache.exercise.jobs import _jobs
from kernelcache.plan.recipe import PlanOverrides, load
from kernelcache.plan.targets import plan_targets
from kernelcache.plan.tasks import Task

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def ran(tmp_path: Path, name: str) -> list[str]:
    """The units whose exercise process ran in build ``name``, as target/unit."""
    work = tmp_path / name / "work"
    return sorted(f"{p.parent.parent.parent.name}/{p.parent.name}" for p in work.rglob("worker.log"))


def blobs_of(cache: Path, kind: str) -> dict[str, Path]:
    found = {}
    for blob in DirStore(cache).blobs():
        if blobs.unpack(blob.path.read_bytes(), blob.key)[0].kind == kind:
            found[blob.key] = blob.path
    return found


def bundle_bytes(result) -> list[bytes]:
    return [b.path.read_bytes() for b in result.bundles]


# -- the key ---------------------------------------------------------------------------------------------------


def units(plan, tmp_path: Path) -> dict[str, dict[str, object]]:
    """{product profile: {unit: job}} for the plan's cross targets of sm_90."""
    found = {}
    for target in plan_targets(plan, "sm_90", "cross", []):
        work = tmp_path / target.label
        found[target.profiles[0].name] = {name: job for name, _, job in _jobs(plan, target, work, work / "cache", 2,
                                                                               ())}
    return found


def test_a_unit_without_a_device_keyed_path_is_one_key_for_every_product(tmp_path):
    plan = load("qwen3-30b-a3b").override(PlanOverrides(paths=["mrv2", "moe"]))
    stack = stack_inputs()
    jobs = units(plan, tmp_path)
    assert sorted(jobs) == ["h100-sxm", "h200"] and sorted(jobs["h200"]) == ["151936", "model"]
    assert unit_key(jobs["h100-sxm"]["151936"], stack) == unit_key(jobs["h200"]["151936"], stack)
    assert unit_key(jobs["h100-sxm"]["model"], stack) != unit_key(jobs["h200"]["model"], stack)  # the MoE tables
    other = units(plan.override(PlanOverrides(max_num_seqs=8)), tmp_path / "other")
    assert unit_key(other["h200"]["151936"], stack) != unit_key(jobs["h200"]["151936"], stack)


def test_the_key_changes_with_the_stack_and_with_the_task_module(tmp_path, monkeypatch):
    source = (ROOT / "kernelcache" / "exercise" / "testkernels.py").read_text()
    (tmp_path / "kc_record_kernels.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = load().override(PlanOverrides(**{k: v for k, v in FLAGS.items() if k != "mode"}))
    [target] = plan_targets(plan, "sm_90", "cross", [])
    task = Task("kc_record_kernels:run", label="testkernels")
    [(_, _, job)] = _jobs(plan, target, tmp_path / "w", tmp_path / "w" / "cache", 1, (task,))
    before = unit_key(job, stack_inputs())
    assert unit_key(job, stack_inputs()) == before
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert unit_key(job, stack_inputs()) != before
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    (tmp_path / "kc_record_kernels.py").write_text(source + "\n# edited\n")
    assert unit_key(job, stack_inputs()) != before


# -- reuse, and what falls back to running the unit -------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The test kernels built without a build cache: what every build here must write, byte for byte."""
    return build(tmp_path_factory.mktemp("reference"), "plain", False)


def test_a_warm_build_runs_no_exercise_process(reference, cold_build, tmp_path):
    cache = filled(cold_build, tmp_path)
    cold = cold_build[1].targets[0]
    assert ran(cold_build[0], "cold") == ["sm_90-132sm/extra"] and cold.build_cache.units.kept == 1
    warm_result = build(tmp_path, "warm", str(cache))
    warm = warm_result.targets[0]
    assert ran(tmp_path, "warm") == []
    assert (warm.compiles, warm.build_cache.units.reused, warm.build_cache.units.kept) == (0, 1, 0)
    assert warm.coverage == cold.coverage
    assert bundle_bytes(warm_result) == bundle_bytes(reference)


def test_a_record_whose_kernel_is_gone_runs_its_unit_again(reference, cold_build, tmp_path):
    cache = filled(cold_build, tmp_path)
    gone = sorted(blobs_of(cache, "kernel").items())[0][1]
    gone.unlink()
    result = build(tmp_path, "again", str(cache))
    target = result.targets[0]
    assert ran(tmp_path, "again") == ["sm_90-132sm/extra"]
    assert (target.compiles, target.build_cache.units.reused, target.build_cache.units.kept) == (1, 0, 1)
    assert bundle_bytes(result) == bundle_bytes(reference)


def test_a_corrupt_record_runs_its_unit_again_and_is_replaced(reference, cold_build, tmp_path):
    cache = filled(cold_build, tmp_path)
    [(key, record)] = blobs_of(cache, "exercise").items()
    record.write_bytes(record.read_bytes()[:100])
    result = build(tmp_path, "again", str(cache))
    assert ran(tmp_path, "again") == ["sm_90-132sm/extra"] and result.targets[0].compiles == 0
    assert bundle_bytes(result) == bundle_bytes(reference)
    blobs.unpack(blobs_of(cache, "exercise")[key].read_bytes(), key)  # a whole record again
    build(tmp_path, "third", str(cache))
    assert ran(tmp_path, "third") == []


def test_units_restored_at_once_into_one_cache_dir_all_come_back(tmp_path):
    """A warm build restores its units from threads of one process into the target's one cache dir, and units
    share kernels: two threads may write one entry at once. Each must still get its whole record back (a failed
    restore runs the unit again)."""
    store = DirStore(tmp_path / "store")
    shared = [_kernel(store, f"shared{i}") for i in range(64)]
    own = [_kernel(store, f"own{unit}") for unit in range(8)]
    records = [{LOG: b"", RESULT: b"{}", KEYS: UnitUse(tuple(sorted([*shared, key])), ()).to_json()} for key in own]
    for attempt in range(5):
        restored = _restore_at_once(store, records, tmp_path / f"attempt{attempt}")
        assert all(use is not None for use in restored)
        cache_dir = tmp_path / f"attempt{attempt}" / "cache"
        assert sorted(p.name for p in cache_dir.iterdir()) == sorted([*shared, *own])
        assert not list(cache_dir.rglob("*.tmp"))


def _restore_at_once(store: DirStore, records: list[dict], where: Path) -> list:
    cache_dir = where / "cache"
    cache_dir.mkdir(parents=True)

    def one(unit: int):
        return restore(store, records[unit], where / f"job{unit}", cache_dir, [str(where)])

    with ThreadPoolExecutor(max_workers=len(records)) as pool:
        return list(pool.map(one, range(len(records))))


def _kernel(store: DirStore, name: str) -> str:
    """A kernel entry in ``store`` under a Triton-shaped key made from ``name``; returns the key."""
    key = base64.b32encode(hashlib.sha256(name.encode()).digest()).decode().rstrip("=")
    files = {f"{name}.cubin": f"{name} ".encode() * 512, f"{name}.json": b"{}"}  # no path in it: nothing foreign
    entry, blob = blobs.pack(key, "kernel", f"{name}.json", files)
    store.put(key, entry.variant, blob)
    return key


WRITES_ASIDE = '''
import os
from kernelcache.exercise import testkernels


def run():
    # A cache dir no compile() or helper-module lookup logs: a record would not bring it back.
    os.makedirs(os.path.join(os.environ["TRITON_CACHE_DIR"], "A" * 52), exist_ok=True)
    return testkernels.run()
'''


def test_a_cache_dir_no_unit_logged_keeps_no_record(tmp_path, monkeypatch):
    (tmp_path / "kc_writes_aside.py").write_text(WRITES_ASIDE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    task = Task("kc_writes_aside:run", label="testkernels")
    first = build(tmp_path, "first", str(tmp_path / "cache"), tasks=(task,)).targets[0]
    assert first.build_cache.units.kept == 0 and "A" * 52 in first.build_cache.units.not_kept
    build(tmp_path, "second", str(tmp_path / "cache"), tasks=(task,))
    assert ran(tmp_path, "second") == ["sm_90-132sm/extra"]


def test_an_edited_task_module_runs_its_unit_again(tmp_path, monkeypatch):
    source = (ROOT / "kernelcache" / "exercise" / "testkernels.py").read_text()
    module = tmp_path / "mods" / "kc_edited_kernels.py"
    module.parent.mkdir()
    module.write_text(source)
    monkeypatch.setenv("PYTHONPATH", str(module.parent))
    monkeypatch.syspath_prepend(str(module.parent))
    task = Task("kc_edited_kernels:run", label="testkernels")
    build(tmp_path, "first", str(tmp_path / "cache"), tasks=(task,))
    build(tmp_path, "same", str(tmp_path / "cache"), tasks=(task,))
    assert ran(tmp_path, "same") == []
    module.write_text(source + "\n# edited\n")
    shutil.rmtree(module.parent / "__pycache__", ignore_errors=True)
    build(tmp_path, "edited", str(tmp_path / "cache"), tasks=(task,))
    assert ran(tmp_path, "edited") == ["sm_90-132sm/extra"]


# -- vLLM's own paths --------------------------------------------------------------------------------------------


SAMPLER = {"gpus": ["h200"], "paths": ["mrv2"], "dtypes": ["float32"], "max_num_seqs": 2, "mode": "cross"}


@pytest.mark.slow
def test_one_more_vocab_runs_only_its_own_unit(tmp_path):
    cache = str(tmp_path / "cache")
    kernelcache.build("sm_90", vocabs=[1000], output_dir=tmp_path / "one", workdir=tmp_path / "one" / "work",
                      build_cache=cache, **SAMPLER)
    two = kernelcache.build("sm_90", vocabs=[1000, 2000], output_dir=tmp_path / "two",
                            workdir=tmp_path / "two" / "work", build_cache=cache, **SAMPLER)
    assert ran(tmp_path, "two") == ["sm_90-132sm/2000"]
    assert two.targets[0].build_cache.units.reused == 1
    plain = kernelcache.build("sm_90", vocabs=[1000, 2000], output_dir=tmp_path / "plain",
                              workdir=tmp_path / "plain" / "work", build_cache=False, **SAMPLER)
    assert bundle_bytes(two) == bundle_bytes(plain)
    # The one unit that ran compiled vLLM's warmup from every core; without records two units shared them.
    cores = os.cpu_count() or 1
    assert warmup_threads(tmp_path, "two", "2000") == cores
    assert warmup_threads(tmp_path, "plain", "2000") == max(1, cores // 2)


def warmup_threads(tmp_path: Path, name: str, unit: str) -> int:
    job = json.loads((tmp_path / name / "work" / "sm_90-132sm" / "jobs" / unit / "job.json").read_text())
    return int(job["env"]["VLLM_TRITON_JIT_WARMUP_NUM_THREADS"])


@pytest.mark.slow
def test_two_products_of_one_build_run_their_shared_unit_once(tmp_path):
    """Qwen3-30B-A3B's MRV2 sampler (one unit, the same for every product) and its fused-MoE layer (one unit per
    product: the tile configs come by device name), for h100-sxm and h200 in one build without a build cache."""
    flags = {"recipe": "qwen3-30b-a3b", "paths": ["mrv2", "moe"], "max_num_seqs": 2, "max_num_batched_tokens": 16,
             "mode": "cross", "build_cache": False}
    both = kernelcache.build("sm_90", gpus=["h100-sxm", "h200"], output_dir=tmp_path / "both" / "out",
                             workdir=tmp_path / "both" / "work", **flags)
    runs = ran(tmp_path, "both")
    assert sorted(r.split("/")[1] for r in runs) == ["151936", "model", "model"]
    assert sorted(t.build_cache.units.reused for t in both.targets) == [0, 1]  # the vocab unit, copied
    assert [t.build_cache.location for t in both.targets] == [None, None]  # one build's own store, not a cache
    # Each product against its build alone: whichever target ran the shared unit, the one that copied it holds
    # the same kernels and gcc-built helper modules (launchers) as a build that ran it.
    for gpu in ("h100-sxm", "h200"):
        alone = kernelcache.build("sm_90", gpus=[gpu], output_dir=tmp_path / gpu, **flags)
        [mine] = [b for b in both.bundles if b.manifest.target.gpu == gpu]
        assert member_digests(alone.bundles[0].path) == member_digests(mine.path), gpu
        assert bundle_bytes(alone) == [mine.path.read_bytes()]


def member_digests(bundle: Path) -> dict[str, str]:
    from kernelcache.format.archive import iter_members

    return {name: hashlib.sha256(data).hexdigest()[:16] for _, name, data in iter_members(bundle)}

