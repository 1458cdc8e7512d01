"""Read-only base + writable overlay: hits from a really read-only installed cache, misses logged and replayed.

The base is installed, then moved (so its group files name paths that no longer exist, as when an
image layer is mounted elsewhere), then made read-only with a read-only bind mount (tests/helpers/mounts.py
says what it falls back to where it cannot mount). Workers compile kernelcache's test kernels for
sm_90 behind the fake target, through ``kernelcache_overlay`` as ``kernelcache env --read-only``
sets it up.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import ROOT, TESTKERNELS, clean_env, kc, run_job, tree
from helpers.mounts import read_only

from kernelcache.cachedir import STATE_DIR, CacheDir
from kernelcache.errors import BaseUnusable, ReadOnlyCache, StorageError, UsageError
from kernelcache.exercise.worker import Job
from kernelcache.plan import misses
from kernelcache.plan.tasks import Task
from kernelcache.runtime.overlay import MANAGER, SITE_DIR, overlay_environment

VARIANTS = Task("kernelcache.exercise.testkernels:run_variants", label="variants")


@pytest.fixture
def ro_base(bundle90, tmp_path):
    """(read-only cache dir, the writable dir behind it, how it was made read-only)."""
    kc("install", str(bundle90), "--cache-dir", str(tmp_path / "orig" / "cache"), "--no-gpu-check", check=True)
    moved = tmp_path / "moved"
    (tmp_path / "orig").rename(moved)
    with read_only(moved, tmp_path / "ro") as how:
        yield tmp_path / "ro" / "cache", moved / "cache", how


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_hits_come_from_the_read_only_base_and_misses_are_logged_then_replayed(ro_base, tmp_path):
    base, behind, how = ro_base
    overlay = tmp_path / "overlay"
    env = overlay_environment(CacheDir.at(base), overlay)
    log = Path(env["KERNELCACHE_MISS_LOG"])
    before = tree(behind)

    _, compiled = run_job(tmp_path / "w1", overlay, 90, tasks=(TESTKERNELS, VARIANTS), env=env)
    hits = [r for r in compiled if r["cache_hit"]]
    missed = [r for r in compiled if not r["cache_hit"]]
    assert len(hits) >= 20 and len(missed) == 2, how  # every bundled kernel hit through the moved group files
    assert {r["name"] for r in missed} == {"add_kernel", "scale_kernel"}
    assert tree(behind) == before  # (and the mount would have refused any write)
    assert sorted(p.name for p in overlay.iterdir() if p.name != STATE_DIR) == sorted(r["key"] for r in missed)

    records = lines(log)
    assert {(r["kind"], r["key"]) for r in records} == {("kernel", r["key"]) for r in missed}
    for record in records:
        assert record["fn_module"] == "kernelcache.exercise.testkernels" and record["specialization_data"]
        assert record["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
        assert record["base"] == str(base) and record["time"] > 0
    variant = next(r for r in records if r["kernel"] == "scale_kernel")
    assert variant["num_warps"] == 2 and variant["constexprs"] == {"BLOCK": 1024, "SQUARE": True}

    _, again = run_job(tmp_path / "w2", overlay, 90, tasks=(TESTKERNELS, VARIANTS), env=env)
    assert len(again) == len(compiled) and all(r["cache_hit"] for r in again)  # the misses now hit the overlay
    assert len(lines(log)) == len(records)

    parsed = misses.read(log)
    assert {t.key for t in parsed.targets} == {r["key"] for r in missed} and not parsed.skipped
    tasks = misses.replay_tasks(log, 90)
    assert misses.replay_tasks(log, 100) == [] and len(tasks) == 1
    result, replayed = run_job(tmp_path / "w3", tmp_path / "fresh", 90, tasks=tasks)
    assert result["tasks"][0]["summary"]["replayed"] == 2
    assert {r["key"] for r in replayed} == {r["key"] for r in missed}  # the same cache keys, compiled anew
    assert not any(r["cache_hit"] for r in replayed)
    assert any(p.name.startswith("__triton_launcher") for p in (tmp_path / "fresh").rglob("*.so"))


def test_replay_refuses_another_arch(ro_base, tmp_path):
    base, _, _ = ro_base
    overlay = tmp_path / "overlay"
    env = overlay_environment(CacheDir.at(base), overlay)
    run_job(tmp_path / "w1", overlay, 90, tasks=(VARIANTS,), env=env)
    task = misses.replay_tasks(env["KERNELCACHE_MISS_LOG"], 90)[0]
    outcome = run_worker(tmp_path / "w2", tmp_path / "c100", 100, (task,), {})
    assert not outcome["ok"] and "this worker targets sm_100" in outcome["tasks"][0]["error"]


def run_worker(work: Path, cache: Path, capability: int, tasks, env: dict) -> dict:
    """A worker whose failure is the point (run_job asserts success)."""
    work.mkdir(parents=True, exist_ok=True)
    job = Job(cache_dir=str(cache), compile_log=str(work / "c.jsonl"), capability=capability, sm_count=132,
              mode="cross", tasks=tuple(tasks))
    (work / "job.json").write_text(job.to_json())
    subprocess.run([sys.executable, "-m", "kernelcache.exercise.worker", str(work / "job.json")], cwd=ROOT,
                   env=clean_env(**env), capture_output=True, text=True, timeout=600)
    return json.loads((work / "job.json.result").read_text())


def test_without_the_overlay_plain_triton_fails_on_the_read_only_base(ro_base, tmp_path):
    """The control: Triton's own manager on the moved read-only base misses every kernel (stale
    absolute paths) and then crashes writing the miss."""
    base, _, how = ro_base
    outcome = run_worker(tmp_path / "w", base, 90, (TESTKERNELS,), {})
    error = outcome["tasks"][0].get("error", "")
    assert not outcome["ok"], how
    assert "Read-only file system" in error or "Permission denied" in error, error


def test_env_run_and_activate_refuse_a_read_only_cache_without_the_overlay(ro_base, tmp_path):
    """The setup of the control above is refused before the engine starts: one line, exit 42, and
    the way out (--read-only) named; with --read-only the same dir is served."""
    base, behind, _ = ro_base
    before = tree(behind)
    for args in (("env", "--cache-dir", str(base)), ("run", "--cache-dir", str(base), "--", "true")):
        done = kc(*args)
        assert done.returncode == ReadOnlyCache.exit_code, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "--read-only" in done.stderr
    code = f"import kernelcache; kernelcache.activate(cache_dir={str(base)!r})"
    api = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True)
    assert "ReadOnlyCache" in api.stderr
    assert kc("env", "--read-only", "--cache-dir", str(base), "--overlay", str(tmp_path / "ov")).returncode == 0
    assert tree(behind) == before


def test_a_sitecustomize_ahead_of_ours_degrades_honestly(ro_base, tmp_path):
    """If another sitecustomize shadows ours, the manager attaches the listener itself when Triton
    first imports it. A compile that is itself the first cache lookup of the process (no launcher
    prebuild here, which would otherwise come first) is logged without a specialization, and says so."""
    base, _, _ = ro_base
    overlay = tmp_path / "overlay"
    env = overlay_environment(CacheDir.at(base), overlay)
    other = tmp_path / "othersite"
    other.mkdir()
    (other / "sitecustomize.py").write_text("")
    env["PYTHONPATH"] = f"{other}:{env['PYTHONPATH']}"
    run_job(tmp_path / "w", overlay, 90, tasks=(VARIANTS,), env=env, prebuild=False)
    records = sorted(lines(Path(env["KERNELCACHE_MISS_LOG"])), key=lambda r: r["kernel"])
    assert [r["kernel"] for r in records] == ["add_kernel", "scale_kernel"]
    assert records[0]["specialization_data"] is None and "listener" in records[0]["why"]
    assert records[1]["specialization_data"]
    parsed = misses.read(env["KERNELCACHE_MISS_LOG"])
    assert [t.kernel for t in parsed.targets] == ["scale_kernel"] and parsed.skipped[0]["kernel"] == "add_kernel"


PRINT_ENV = ("import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in ('TRITON_CACHE_DIR', "
             "'TRITON_CACHE_MANAGER', 'KERNELCACHE_BASE_DIR', 'KERNELCACHE_MISS_LOG', 'PYTHONPATH')} | "
             "{'triton_imported': 'triton' in sys.modules, 'marker': os.environ.get('SHADOWED_RAN')}))")


def test_run_read_only_execs_with_the_overlay_and_keeps_a_shadowed_sitecustomize(ro_base, tmp_path):
    base, _, _ = ro_base
    other = tmp_path / "othersite"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = 'yes'\n")
    done = kc("run", "--read-only", "--base", str(base), "--overlay", str(tmp_path / "ov"), "--",
              sys.executable, "-c", PRINT_ENV, env={"PYTHONPATH": str(other)}, check=True)
    seen = json.loads(done.stdout)
    assert seen["TRITON_CACHE_DIR"] == str(tmp_path / "ov") and seen["TRITON_CACHE_MANAGER"] == MANAGER
    assert seen["KERNELCACHE_BASE_DIR"] == str(base)
    assert seen["PYTHONPATH"].split(":") == [str(SITE_DIR), str(other)]
    assert seen["marker"] == "yes"  # the user's own sitecustomize still ran
    assert seen["triton_imported"] is False  # ours imports nothing heavy up front

    exports = kc("env", "--read-only", "--cache-dir", str(base), "--overlay", str(tmp_path / "ov"), check=True)
    assert f"export TRITON_CACHE_MANAGER={MANAGER}" in exports.stdout


def test_read_only_usage_and_base_errors(ro_base, tmp_path, bundle90):
    base, behind, _ = ro_base
    assert kc("env", "--base", str(base)).returncode == UsageError.exit_code
    assert kc("run", "--read-only", "--bundle", str(bundle90), "--", "true").returncode == UsageError.exit_code
    assert kc("env", "--read-only", "--base", str(base), "--overlay", str(base)).returncode == UsageError.exit_code
    missing = kc("env", "--read-only", "--base", str(tmp_path / "nope"), "--overlay", str(tmp_path / "ov"))
    assert missing.returncode == BaseUnusable.exit_code and "not a directory" in missing.stderr
    unwritable = kc("env", "--read-only", "--base", str(base), "--overlay", str(base.parent / "overlay"))
    assert unwritable.returncode == StorageError.exit_code and len(unwritable.stderr.strip().splitlines()) == 1


def test_a_base_frozen_mid_install_or_missing_files_is_refused(bundle90, tmp_path):
    cache = tmp_path / "cache"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    victim = next(cache.glob("*/*.cubin"))
    victim.unlink()
    done = kc("env", "--read-only", "--base", str(cache), "--overlay", str(tmp_path / "ov"))
    assert done.returncode == BaseUnusable.exit_code and "lacks files" in done.stderr
    (cache / STATE_DIR / "journal" / "x.json").write_text("{}")
    done = kc("env", "--read-only", "--base", str(cache), "--overlay", str(tmp_path / "ov"))
    assert done.returncode == BaseUnusable.exit_code and "unfinished install" in done.stderr


def test_the_gpu_overlay_check_script_passes_on_the_fake_target(tmp_path):
    """scripts/gpu/overlay_check.py is what runs once on the H200; --fake runs the same steps here."""
    done = subprocess.run([sys.executable, "scripts/gpu/overlay_check.py", "--fake", "--work", str(tmp_path / "w")],
                          cwd=ROOT, env=clean_env(OUT=str(tmp_path / "out")), capture_output=True, text=True,
                          timeout=600)
    report = json.loads((tmp_path / "out" / "gpu_overlay_check.json").read_text())
    assert done.returncode == 0 and report["verdict"] == "pass", (report.get("error"), report.get("checks"))
    assert report["control_plain_triton"]["ok"] is False


def test_build_from_misses_puts_the_missed_keys_in_the_next_bundle(ro_base, tmp_path, build_cache):
    pytest.importorskip("vllm")
    base, _, _ = ro_base
    env = overlay_environment(CacheDir.at(base), tmp_path / "overlay")
    _, compiled = run_job(tmp_path / "w1", tmp_path / "overlay", 90, tasks=(TESTKERNELS, VARIANTS), env=env)
    missed = {r["key"] for r in compiled if not r["cache_hit"]}
    assert len(missed) == 2
    out = tmp_path / "bundles"
    # A small build is enough: the missed keys come from the miss log, whatever the plan. This one is
    # tests/test_build_vllm.py's small build (its plan, the session's build cache): whichever runs second takes
    # MRV2's kernels from the other instead of compiling them again.
    done = kc("build", "--arch", "sm_90", "--gpu", "h200", "--vocab", "151665", "--dtype", "float32", "--path", "mrv2",
              "--max-num-seqs", "4", "--mode", "cross", "-o", str(out), "--from-misses", env["KERNELCACHE_MISS_LOG"],
              "--build-cache", str(build_cache), "--json", check=True)
    bundle = Path(json.loads(done.stdout)[0]["bundles"][0]["path"])
    from kernelcache.format import archive

    keys = {k.key for k in archive.read_manifest(bundle).kernels}
    assert missed <= keys and any(k.name == "_gumbel_sample_kernel" for k in archive.read_manifest(bundle).kernels)
