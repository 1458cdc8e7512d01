"""The one GPU driver, scripts/gpu/prove.py, on the CPU: which check proves a family, which bundle and tasks it
takes, what it would run, how it compares two processes' outputs and when it calls a family proven. (The checks
themselves run vLLM on a GPU; the lead runs them.)"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelcache.plan import families, recipe
from kernelcache.plan.tasks import plan_units

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu" / "prove.py"


def load_prove():
    spec = importlib.util.spec_from_file_location("prove", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["prove"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


prove = load_prove()


def test_every_family_with_a_check_resolves_to_it():
    assert prove.checks()["sampler"] == ("registry", "mrv1", "mrv2")
    assert prove.resolve(["mrv2", "moe", "sampler", "registry"]) == ["sampler", "moe"]
    assert prove.resolve(["mrv1_spec_decode"]) == ["spec_decode"]
    assert prove.resolve(["flashinfer_attention"]) == ["flashinfer_attention"]
    with pytest.raises(SystemExit, match="no GPU check proves 'flashinfer'"):
        prove.resolve(["flashinfer"])


def test_every_check_defines_the_public_entry_point():
    for name in prove.checks():
        tree = ast.parse((prove.CHECKS / f"{name}.py").read_text())
        (found,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
        assert [a.arg for a in found.args.args] == ["tasks", "records"], name


def test_every_name_a_check_imports_from_kernelcache_exists():
    """What a check imports when it runs (inside its functions) is there: a moved or renamed driver helper fails
    here, on the CPU, not on the GPU box."""
    for name in prove.checks():
        tree = ast.parse((prove.CHECKS / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernelcache"):
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)
                           and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
                assert not missing, f"{name}: {node.module} has no {missing}"


def test_every_check_loads_without_a_gpu():
    """A check imports torch, Triton, vLLM and its family's driver when it runs: loading it (as --child does) needs
    none of them."""
    for name in prove.checks():
        assert callable(prove.load_check(name).check), name


def test_the_bundle_of_the_visible_gpu_is_picked(tmp_path):
    for name in ("qwen3-sm_90-h100-sxm.tar.zst", "qwen3-sm_90-h200.tar.zst"):
        (tmp_path / name).write_bytes(b"")
    assert prove.pick_bundle(str(tmp_path), "moe", "h200").name == "qwen3-sm_90-h200.tar.zst"
    assert prove.pick_bundle(str(tmp_path), "moe", "h100-sxm").name == "qwen3-sm_90-h100-sxm.tar.zst"
    assert prove.pick_bundle(str(tmp_path), "moe", "").name == "qwen3-sm_90-h100-sxm.tar.zst"
    assert prove.pick_bundle(str(tmp_path / "qwen3-sm_90-h200.tar.zst"), "moe", "h100-sxm").parent == tmp_path
    assert prove.pick_bundle(str(tmp_path / "none"), "moe", "h200") is None


def test_a_check_gets_its_families_tasks_of_the_plan():
    """What the build ran: the first vocab's tasks of the families the check proves, and the model's."""
    plan = recipe.load("qwen3-30b-a3b")
    (moe,) = prove.tasks_for("moe", plan)
    assert moe == next({"call": t.call, "kwargs": t.kwargs, "label": t.label}
                       for _, tasks in plan_units(plan) for t in tasks if t.label == "moe")
    default = recipe.load()
    sampler = prove.tasks_for("sampler", default)
    assert [t["label"] for t in sampler] == ["registry", "mrv1", "mrv2"]
    assert {t["kwargs"]["vocab"] for t in sampler} == {default.vocabs[0].size}
    assert prove.tasks_for("spec_decode", default) == []  # no drafts, no spec-decode task
    gemma = prove.tasks_for("flashinfer_attention", recipe.load("gemma-2-9b-flashinfer"))
    assert sorted(t["kwargs"]["sliding_window"] for t in gemma) == [0, 4096]  # one layer per window


def run(digests: dict, compiles: int = 0, gcc: int = 0, **more) -> dict:
    return {"digests": digests, "compiles": compiles, "gcc_builds": gcc, "hits": 5, **more}


@pytest.mark.parametrize("bundle, ok, differing", [
    (run({"a": "1", "b": "2"}), True, []),
    (run({"a": "1", "b": "3"}), False, ["b"]),
    (run({"a": "1", "b": "2"}, compiles=1), False, []),
    (run({"a": "1", "b": "2"}, gcc=1), False, []),
    (run({"a": "1", "b": "2"}, nvcc_runs=1), False, []),  # FlashInfer built a module: the bundle missed it
    (run({"a": "1"}), False, []),
])
def test_a_family_is_proven_when_the_bundle_compiles_nothing_and_matches_cold(bundle, ok, differing):
    summary = prove.summarise("moe", {"cold": run({"a": "1", "b": "2"}, compiles=9), "bundle": bundle}, None)
    assert summary["ok"] is ok
    assert summary["bundle"]["outputs_vs_cold"]["differing"] == differing
    assert "digests" not in summary["bundle"] and summary["cold"]["compiles"] == 9


def test_a_state_that_failed_proves_nothing():
    summary = prove.summarise("moe", {"cold": run({"a": "1"}), "bundle": {"error": "exit 1: boom"}}, None)
    assert summary["ok"] is False and summary["bundle"] == {"error": "exit 1: boom"}


def test_the_tuned_state_is_held_to_the_chosen_one():
    """A tuned bundle serves the autotuner's kept choices: it must compute what a cold process seeded with those
    choices computes, not what a cold process that timed again chose."""
    runs = {"cold": run({"a": "1"}), "bundle": run({"a": "1"}), "tuned": run({"a": "2"}), "chosen": run({"a": "2"})}
    summary = prove.summarise("gdn", runs, None)
    assert summary["ok"] and summary["tuned"]["outputs_vs_chosen"]["identical"]
    assert not summary["chosen"]["outputs_vs_cold"]["identical"]  # reported, not held against the bundle


def test_outputs_are_digested_bit_for_bit():
    import torch

    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    flipped = base.clone()
    flipped.view(torch.int32)[1, 2] ^= 1  # one bit of one element
    found = prove.digests({"x": base, "y": base.clone(), "z": flipped, "w": base.to(torch.bfloat16),
                           "v": base.reshape(4, 3), "e": torch.empty(0)})
    assert found["x"] == found["y"]
    assert len({found[k] for k in ("x", "z", "w", "v", "e")}) == 5


def test_the_nvcc_wrapper_logs_each_run_to_the_states_log_and_runs_the_real_one(tmp_path, monkeypatch):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").symlink_to("/bin/echo")  # the box's nvcc, here any program that answers
    monkeypatch.setenv("CUDA_HOME", str(home))
    env = prove.nvcc_env(tmp_path / "work", dry=False)
    assert env["CUDA_HOME"] == str(home)
    log = tmp_path / "cold.nvcc.log"
    for args in (["-c", "a.cu"], ["-c", "b.cu"]):
        done = subprocess.run([env["FLASHINFER_NVCC"], *args], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", prove.NVCC_LOG: str(log)})
        assert done.returncode == 0 and done.stdout.split() == args
    assert [line.split(" ", 1)[1] for line in log.read_text().splitlines()] == ["-c a.cu", "-c b.cu"]
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert prove.nvcc_env(tmp_path / "work2", dry=False) == {}  # no nvcc: nothing to count, nothing set


def test_the_dry_run_prints_each_state_and_runs_nothing(tmp_path):
    bundle = tmp_path / "b.tar.zst"
    bundle.write_bytes(b"")
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, str(SCRIPT), "sampler", "moe", "mrv1_spec_decode", "--recipe",
                           "qwen3-30b-a3b", "--bundle", f"sampler={bundle}", "--bundle", f"moe={bundle}", "--bundle",
                           f"mrv1_spec_decode={bundle}", "--states", "cold,bundle,tuned,chosen", "--work", str(work),
                           "--out", str(tmp_path / "out"), "--dry-run"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"kernelcache install {bundle} --cache-dir {work}/moe/bundle/cache" in done.stdout
    assert f"kernelcache tune {bundle} -o {work}/moe/tuned.tar.zst" in done.stdout
    assert f"seed_choices.py {work}/moe/tuned.tar.zst {work}/moe/chosen/cache" in done.stdout
    children = [line for line in lines if "--child moe" in line]
    assert [line.split("]")[0] for line in children] == ["[cold", "[bundle", "[tuned", "[chosen"]
    tasks = json.loads(children[0].split("--tasks ")[1].split(" --result")[0].strip("'"))
    assert tasks == prove.tasks_for("moe", recipe.load("qwen3-30b-a3b"))
    assert "# spec_decode: skipped: the plan has no task of mrv1_spec_decode" in done.stdout
    assert not work.exists() and not (tmp_path / "out" / "prove.json").exists()


def test_a_run_cut_short_keeps_the_families_done(tmp_path):
    """The summary is written after each family, so a device call killed at its limit still brings back what was
    done: here the driver is killed while the second family's cold state runs."""
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, str(SCRIPT), "moe", "sampler", "--recipe", "vllm-sampler",
                               "--bundle", f"moe={tmp_path / 'none'}", "--states", "cold", "--work",
                               str(tmp_path / "work"), "--out", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True)
    try:
        for _ in range(600):  # the first family has no task of its own in this plan: it is summarised at once
            if (out / "prove.json").is_file() or driver.poll() is not None:
                break
            time.sleep(0.2)
        running = driver.poll() is None
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the state's process it started
        driver.wait()
    kept = json.loads((out / "prove.json").read_text())
    assert running  # the file came while the second family was still running
    assert list(kept["families"]) == ["moe"] and kept["families"]["moe"]["ok"] is False


def test_a_family_registered_with_a_check_is_proven_by_the_driver():
    """The driver learns the checks from the registry: a family that names one is resolved to it."""
    class Selftest(families.Family):
        name, exercise = "selftest", "kernelcache.exercise.testkernels:run"
        about = families.About("a test's family", ("kernelcache.exercise.testkernels", "test kernels"), gpu_check="moe")

        def tasks(self, plan, vocab: int) -> tuple:
            return ()

    family = families.register(Selftest())
    try:
        assert prove.checks()["moe"] == ("moe", family.name)
        assert prove.resolve(["selftest"]) == ["moe"]
    finally:
        families.unregister("selftest")


def test_a_check_sees_what_an_exercise_hands_on_only_while_it_watches():
    from kernelcache.exercise import watch

    seen = []
    watch.seen("runner.sampled", output=1)  # nobody watches: nothing happens
    with watch.watching(lambda point, values: seen.append((point, values))):
        watch.seen("runner.sampled", output=2)
    watch.seen("runner.sampled", output=3)
    assert seen == [("runner.sampled", {"output": 2})]
    with pytest.raises(RuntimeError), watch.watching(seen.append):
        raise RuntimeError("a check that fails stops watching")
    assert watch._watchers == []
