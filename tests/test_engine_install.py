"""A bundle's vLLM compile artifact in a cache dir (issue 39): the install places its AOT directory before its
receipt, so a SIGKILL anywhere leaves no receipt without the tree (only a journal the next command rolls forward), and
a re-install repairs a bundle recorded without it; ``ls`` and ``verify`` say what is missing. ``prune`` removes a
compile bundle whose record pins another Python, torch, vLLM or transformers, as it removes a Triton bundle for
another Triton.

Real bundles (tests/helpers/bundles.py ``engine_bundle``: the record and the tar of vLLM's ``torch_compile_cache``
tree, zstd, as enginecompile.py packs them), installed for real: in forked children killed with SIGKILL before the
N-th file-system operation (tests/test_crash_safety.py's ``fork_run``), and through the CLI as users run it. The
installs are forced: vLLM's hash check of the stand-in record would need vLLM to configure a served model.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bundles import engine_bundle
from helpers.cachecheck import expected_bytes, has_receipt, leftovers
from helpers.common import ROOT, clean_env, kc
from test_crash_safety import fork_run

from kernelcache.cachedir import CacheDir, recover
from kernelcache.cachedir.vllm_tree import absent
from kernelcache.enginecompile import pinned_here
from kernelcache.format import archive
from kernelcache.format.envscan import package_dir
from kernelcache.install import InstallPlan

HASH = "0f" * 32  # vLLM names an AOT directory by a sha256
AOT = f"vllm/torch_compile_cache/torch_aot_compile/{HASH}"
MODEL = f"{AOT}/rank_0_0/model"
NO_GPU = {"KERNELCACHE_NO_GPU_PROBE": "1"}
CLEAN = {"staging": [], "journal": [], "temp": []}
needs_vllm = pytest.mark.skipif(package_dir("vllm") is None or package_dir("torch") is None,
                                reason="the versions a compile record pins are read from the installed torch and vLLM")


@pytest.fixture(scope="module")
def subject(tmp_path_factory) -> tuple[Path, object, dict[str, bytes]]:
    work = tmp_path_factory.mktemp("engine")
    bundle = engine_bundle(work / "engine.tar.zst", HASH, "vllm serve engine")
    made = bundle, archive.read_manifest(bundle), expected_bytes(bundle)
    # One install and recovery here first: every module they import lazily is loaded before the forks, so each
    # child runs the same file-system events as the one that counted them.
    importlib.import_module("filelock")
    plan(made, work / "warm").execute()
    recover(CacheDir(work / "warm"))
    assert placed(work / "warm", made[2])
    return made


def plan(subject, cache: Path) -> InstallPlan:
    bundle, manifest, _ = subject
    return InstallPlan(bundle, manifest, archive.bundle_digest(manifest), cache, force=True)


def placed(cache: Path, expected: dict[str, bytes]) -> bool:
    """The AOT directory's model file holds the bundle tree's bytes."""
    import io
    import tarfile

    [tree] = [data for name, data in expected.items() if name.endswith(".tar")]
    with tarfile.open(fileobj=io.BytesIO(tree)) as tar:
        model = tar.extractfile(MODEL.removeprefix("vllm/")).read()
    return (cache / MODEL).is_file() and (cache / MODEL).read_bytes() == model


def trace_points(subject, tmp_path: Path) -> tuple[list, int, int, int]:
    """A whole install's file-system events, and where in them the journal, the AOT directory and the receipt are
    renamed into place."""
    ended, report = fork_run(plan(subject, tmp_path / "dry").execute)
    assert ended == "exit 0"
    trace = report["trace"]

    def renamed(test) -> int:
        return next(i for i, (event, path) in enumerate(trace, 1) if event == "os.rename" and test(path))

    journal = renamed(lambda path: "/journal/" in path)
    tree = renamed(lambda path: path.endswith(AOT.removeprefix("vllm/")))
    receipt = renamed(lambda path: path.endswith(".pending"))
    return trace, journal, tree, receipt


def test_a_kill_at_any_point_leaves_no_receipt_without_the_tree_and_the_next_install_completes(subject, tmp_path):
    _, manifest, expected = subject
    trace, journal, tree, receipt = trace_points(subject, tmp_path)
    assert journal < tree < receipt  # the AOT directory is an entry of the journal, renamed in before the receipt
    outcomes = set()
    for point in range(1, len(trace) + 1):
        cache = tmp_path / f"kill-{point}"
        ended, _ = fork_run(plan(subject, cache).execute, kill_at=point)
        assert ended == "killed"
        if has_receipt(cache, manifest):
            assert placed(cache, expected), f"kill {point}: a receipt without the AOT directory"
        if not cache.exists():
            continue
        recover(CacheDir(cache))  # as the next install, env, run or rm does first
        whole = has_receipt(cache, manifest) and placed(cache, expected)
        assert whole == (point > journal), f"kill {point}: a journal's install is finished, none other is"
        assert leftovers(cache) == CLEAN
        outcomes.add(whole)
        assert plan(subject, cache).execute().action == ("already-installed" if whole else "installed")
        assert CacheDir(cache).installed_complete(archive.bundle_digest(manifest), manifest) and placed(cache, expected)
    assert outcomes == {True, False}


def test_an_install_killed_before_its_tree_is_in_place_is_seen_as_pending_and_the_next_install_completes(
        subject, tmp_path):
    bundle, manifest, expected = subject
    _, _, tree, _ = trace_points(subject, tmp_path)
    cache = tmp_path / "cache"
    ended, _ = fork_run(plan(subject, cache).execute, kill_at=tree)  # the kill the old order turned into a receipt
    assert ended == "killed" and not has_receipt(cache, manifest) and not (cache / AOT).exists()

    listing = json.loads(kc("ls", "--cache-dir", str(cache), "--json", env=NO_GPU, check=True).stdout)
    assert listing["bundles"] == [] and any("interrupted install" in w for w in listing["warnings"])
    shown = kc("verify", "--cache-dir", str(cache), env=NO_GPU)
    assert shown.returncode == 2 and "holds no installed bundle" in shown.stderr

    done = kc("install", str(bundle), "--cache-dir", str(cache), "--force", "--no-gpu-check", "--json", env=NO_GPU,
              check=True)
    assert json.loads(done.stdout)["action"] == "already-installed"  # its roll-forward, under the lock, finished it
    assert placed(cache, expected) and leftovers(cache) == CLEAN
    [listed] = json.loads(kc("ls", "--cache-dir", str(cache), "--json", env=NO_GPU, check=True).stdout)["bundles"]
    assert listed["missing_files"] == 0 and AOT in json.loads(
        kc("rm", listed["digest"], "--cache-dir", str(cache), "--json", check=True).stdout)["bundle"]["removed"]


def test_a_bundle_recorded_without_its_tree_is_said_missing_and_a_reinstall_puts_it_back(subject, tmp_path):
    bundle, manifest, expected = subject
    cache = tmp_path / "cache"
    plan(subject, cache).execute()
    shutil.rmtree(cache / AOT)  # what an install killed after its receipt and before its tree left (the old order)
    assert not CacheDir(cache).installed_complete(archive.bundle_digest(manifest), manifest)

    [listed] = json.loads(kc("ls", "--cache-dir", str(cache), "--json", env=NO_GPU, check=True).stdout)["bundles"]
    assert listed["missing_files"] == len(absent(cache, manifest)) == 1
    shown = kc("verify", "--cache-dir", str(cache), env=NO_GPU)
    assert shown.returncode == 43 and MODEL in shown.stderr and "install the bundle again" in shown.stderr

    done = kc("install", str(bundle), "--cache-dir", str(cache), "--force", "--no-gpu-check", "--json", env=NO_GPU,
              check=True)
    assert json.loads(done.stdout)["action"] == "installed"
    assert placed(cache, expected) and leftovers(cache) == CLEAN
    [listed] = json.loads(kc("ls", "--cache-dir", str(cache), "--json", env=NO_GPU, check=True).stdout)["bundles"]
    assert listed["missing_files"] == 0


@needs_vllm
def test_prune_removes_a_compile_bundle_whose_record_pins_other_versions(tmp_path):
    here = pinned_here()
    other = {"python": "3.11.9", "torch": "2.9.0+cu128", "vllm": "0.31.0", "transformers": "4.57.1"}
    bundles = {"same": here, **{key: {**here, key: value} for key, value in other.items()}}
    cache = tmp_path / "cache"
    for index, (name, record) in enumerate(bundles.items()):
        made = engine_bundle(tmp_path / f"{name}.tar.zst", f"{index:02d}" * 32, f"vllm serve {name}", record)
        kc("install", str(made), "--cache-dir", str(cache), "--force", "--no-gpu-check", env=NO_GPU, check=True)

    listing = {b["name"]: b for b in json.loads(kc("ls", "--cache-dir", str(cache), "--json", env=NO_GPU,
                                                    check=True).stdout)["bundles"]}
    assert listing["same"]["matches"] and listing["same"]["differences"] == []
    for key, value in other.items():
        assert not listing[key]["matches"]
        assert listing[key]["differences"] == [f"compile.{key}: {value} -> {here[key]}"]

    pruned = json.loads(kc("prune", "--cache-dir", str(cache), "--json", env=NO_GPU, check=True).stdout)
    assert sorted(b["name"] for b in pruned["bundles"]) == sorted(other)
    aot = cache / "vllm" / "torch_compile_cache" / "torch_aot_compile"
    assert sorted(p.name for p in aot.iterdir()) == ["00" * 32]
    assert [b["name"] for b in json.loads(kc("ls", "--cache-dir", str(cache), "--json", env=NO_GPU,
                                             check=True).stdout)["bundles"]] == ["same"]


@needs_vllm
@pytest.mark.slow
def test_the_versions_read_without_importing_are_those_torch_and_vllm_report_imported():
    """What a compile record pins is what exercise/vllm_compile.py reads from the imported packages."""
    code = ("import json, platform, torch, vllm; from importlib.metadata import version; print(json.dumps("
            "{'python': platform.python_version(), 'torch': torch.__version__, 'vllm': vllm.__version__, "
            "'transformers': version('transformers')}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=clean_env(PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == pinned_here()
