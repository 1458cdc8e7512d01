"""Autotune choices (issue 28): what Triton keeps, what a bundle carries, what install and served processes do.

The choices are Triton's own: ``tests/probes/autotune_disk.py`` launches a real ``@triton.autotune`` kernel
through ``Autotuner.run`` with Triton's disk cache on, behind the fake sm_90 target (CPU tensors, no-op
launches), in a fresh process each time. What is faked, and why: the fake target has no clock, so the
benchmark is the autotuner's own ``do_bench`` hook returning a fixed time per candidate (``BLOCK`` 64 the
fastest) and recording each call; that record is how a test counts benchmark runs. The keys, the
``.autotune.json`` files and their reading are Triton's. ``kernelcache tune`` itself times on a GPU
(``scripts/gpu/prove.py mamba --states cold,bundle,tuned,chosen``); here its two halves that need none, reading
the files a run left (``harvest_choices``) and writing them into a bundle (``with_choices``), make the tuned
bundle that install, ``env``, ``run``, ``activate()``, ``ls``, ``inspect``, ``diff`` and ``merge`` are tested
with. Install's GPU check sees a stub libcuda's GPU (tests/helpers/fakegpu.py).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import ROOT, clean_env, kc
from helpers.fakegpu import build_stub, env_for

from kernelcache.format import archive
from kernelcache.format.manifest import FileRecord, Manifest, Tuning
from kernelcache.plan.gpus import PROFILES
from kernelcache.runtime.overlay import SITE_DIR
from kernelcache.tune import harvest_choices, with_choices

PROBE = ROOT / "tests" / "probes" / "autotune_disk.py"
ALL, STALE = "32,64,128", "32,128"
FASTEST = "BLOCK: 64, num_warps: 4, num_ctas: 1, num_stages: 3, maxnreg: None"
H200, H100, B200 = PROFILES["h200"], PROFILES["h100-sxm"], PROFILES["b200"]
TIMED_ON = Tuning(H200.product, "580.159.04", "13.0", {"max_memory": 3201, "max_sm": 1980}, ())


def probe(cache: Path, blocks: str = ALL, *flags: str, cached: bool = True) -> subprocess.CompletedProcess:
    """The probe in a fresh process on ``cache`` (``cached``: with ``TRITON_CACHE_AUTOTUNING=1``)."""
    env = clean_env(TRITON_CACHE_DIR=str(cache), **({"TRITON_CACHE_AUTOTUNING": "1"} if cached else {}))
    return subprocess.run([sys.executable, str(PROBE), blocks, *flags], env=env, capture_output=True, text=True,
                          timeout=600)


def seen(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def choice_file(cache: Path) -> Path:
    (found,) = cache.glob("*/scaled_copy.autotune.json")
    return found


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Path:
    """A cache where Triton timed the three candidates once and kept its choice, BLOCK 64."""
    cache = tmp_path_factory.mktemp("seeded") / "cache"
    first = seen(probe(cache, ALL, "--log"))
    assert len(first["benched"]) == 3 and first["chosen"] == FASTEST and len(first["files"]) == 1
    timed = [r["config"] for r in first["log"] if r["event"] == "autotune_bench"]
    (lookup,) = [r for r in first["log"] if r["event"] == "autotune"]
    assert timed == first["benched"]  # kernelcache's autotune log saw each candidate Triton timed
    assert f"{lookup['dir']}/{lookup['file']}" == first["files"][0] and lookup["hit"] is False
    return cache


@pytest.fixture
def cache(seeded, tmp_path) -> Path:
    """A copy of the seeded cache, this test's own."""
    return Path(shutil.copytree(seeded, tmp_path / "cache"))


# -- what Triton does with a kept choice (item 4) ----------------------------------------------------------------


def test_a_kept_choice_is_taken_in_a_new_process_without_timing(cache):
    again = seen(probe(cache, ALL, "--log"))
    assert again["benched"] == [] and again["chosen"] == FASTEST
    assert [(r["event"], r["hit"]) for r in again["log"]] == [("autotune", True)]


def test_a_choice_for_a_config_the_kernel_no_longer_lists_is_never_used(cache):
    """BLOCK 64 was chosen among 32, 64, 128; the kernel now lists 32 and 128. Triton hashes the candidates into
    the key of the file, so it looks elsewhere, times the two it has and never launches 64."""
    kept = choice_file(cache)
    old = kept.read_bytes()
    now = seen(probe(cache, STALE))
    assert len(now["benched"]) == 2 and not any("BLOCK: 64" in c for c in now["benched"])
    assert "BLOCK: 128" in now["chosen"]
    assert len(now["files"]) == 2 and kept.read_bytes() == old  # a new file beside the old one, untouched


def test_the_autotune_variable_is_in_no_kernel_key(cache):
    """``TRITON_CACHE_AUTOTUNING`` is not among the variables libtriton hashes into keys (a set variable that is,
    ``MLIR_ENABLE_DUMP``, is listed), and the chosen kernel compiled with it set is a hit without it."""
    listed = subprocess.run([sys.executable, "-c", "import json; from triton._C.libtriton import "
                             "get_cache_invalidating_env_vars as f; print(json.dumps(f()))"],
                            env=clean_env(TRITON_CACHE_AUTOTUNING="1", MLIR_ENABLE_DUMP="1"), capture_output=True,
                            text=True, timeout=300)
    assert set(json.loads(listed.stdout)) == {"MLIR_ENABLE_DUMP"}
    before = sorted(p.name for p in cache.iterdir())
    plain = seen(probe(cache, cached=False))
    assert len(plain["benched"]) == 3 and plain["chosen"] == FASTEST  # no disk cache: timed again
    assert sorted(p.name for p in cache.iterdir()) == before  # and BLOCK 64's kernel was a disk hit


def test_plain_triton_fails_the_launch_on_a_corrupt_choice(cache):
    choice_file(cache).write_text('{"key": [4096')
    done = probe(cache)
    assert done.returncode != 0 and "JSONDecodeError" in done.stderr


UNUSABLE = {
    "truncated": '{"key": [4096',
    "not Triton's shape": '{"key": [4096], "configs_timings": [[{"BLOCK": 64}, [1.0, 1.0, 1.0]]]}',
    "no timings": '{"key": [4096], "configs_timings": []}',
    "a config the kernel does not list": None,  # the real file, plus BLOCK 16 as the fastest
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_the_served_guard_times_an_unusable_choice_again(cache, case):
    target = choice_file(cache)
    text = UNUSABLE[case]
    if text is None:
        data = json.loads(target.read_text())
        data["configs_timings"].append([{**data["configs_timings"][0][0], "kwargs": {"BLOCK": 16}}, [0.1] * 3])
        text = json.dumps(data)
    target.write_text(text)
    done = probe(cache, ALL, "--guard")
    result = seen(done)
    assert len(result["benched"]) == 3 and result["chosen"] == FASTEST and result["guarded"]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("kernelcache:")]
    assert str(target) in line and line.endswith("Triton times the candidates again")
    assert json.loads(target.read_text())["configs_timings"]  # Triton wrote a good one in its place
    if case == "truncated":
        assert seen(probe(cache, ALL, "--guard"))["benched"] == []


# -- a bundle that carries choices ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Path:
    return build_stub(tmp_path_factory.mktemp("stub-libcuda"))


@pytest.fixture(scope="module")
def bundles(seeded, tmp_path_factory) -> dict[str, Path]:
    """``base``: the seeded cache's kernels packed; ``tuned``: the same with its choice, timed on an H200."""
    out = tmp_path_factory.mktemp("tuned")
    base = out / "probe-sm_90.tar.zst"
    kc("pack", str(seeded), "-o", str(base), check=True)
    choices, data = harvest_choices(seeded)
    assert [(c.kernel, c.config, c.candidates) for c in choices] == [("scaled_copy", FASTEST, 3)]
    tuning = dataclasses.replace(TIMED_ON, files=tuple(FileRecord(p, len(b), _sha(b)) for p, b in data.items()))
    tuned = out / "probe-sm_90-tuned.tar.zst"
    with_choices(base, archive.read_manifest(base), tuning, data, tuned)
    return {"base": base, "tuned": tuned}


def _sha(blob: bytes) -> str:
    import hashlib

    return hashlib.sha256(blob).hexdigest()


def installed(bundle: Path, cache: Path, stub: Path, gpu) -> tuple[dict, subprocess.CompletedProcess]:
    done = kc("install", str(bundle), "--cache-dir", str(cache), "--json", env=env_for(stub, gpu))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done


def variables(cache: Path) -> dict[str, str]:
    return json.loads(kc("env", "--cache-dir", str(cache), "--json", check=True).stdout)


def listed(cache: Path) -> dict:
    (row,) = json.loads(kc("ls", "--cache-dir", str(cache), "--json", check=True).stdout)["bundles"]
    return row


def test_a_tuned_bundle_says_where_its_choices_were_timed_and_an_untuned_one_keeps_its_bytes(bundles):
    base, tuned = (archive.read_manifest(bundles[n]) for n in ("base", "tuned"))
    assert "tuning" not in base.to_dict()
    assert Manifest.from_json(base.to_json()).to_json() == base.to_json()
    assert dataclasses.replace(tuned, tuning=None) == base
    assert tuned.tuning.kernels() == ["scaled_copy"] and tuned.tuning.product == H200.product
    assert Manifest.from_json(tuned.to_json()) == tuned
    said = kc("inspect", str(bundles["tuned"]), check=True).stdout
    assert ("autotune choices: 1 for 1 kernel(s) (scaled_copy), timed on NVIDIA H200 (driver 580.159.04; CUDA 13.0; "
            "max_memory 3201 MHz, max_sm 1980 MHz)") in " ".join(said.split())
    assert "autotune choices: none" in kc("inspect", str(bundles["base"]), check=True).stdout


def test_on_the_product_they_were_timed_on_the_choices_are_installed_and_served(bundles, stub, tmp_path):
    cache = tmp_path / "cache"
    result, _ = installed(bundles["tuned"], cache, stub, H200)
    (record,) = archive.read_manifest(bundles["tuned"]).tuning.files
    assert result["choices"] == "installed" and (cache / record.path).read_bytes() == _member(bundles, record)
    found = variables(cache)
    assert found["TRITON_CACHE_AUTOTUNING"] == "1" and found["KERNELCACHE_AUTOTUNE_CHECK"] == "1"
    assert str(SITE_DIR) in found["PYTHONPATH"].split(":")
    row = listed(cache)
    assert row["tuned_on"].startswith("NVIDIA H200 (driver 580.159.04") and row["choices"] == 1
    assert not row["choices_skipped"] and row["missing_files"] == 0
    served = seen(kc("run", "--cache-dir", str(cache), "--", sys.executable, str(PROBE), ALL, check=True))
    assert (served["benched"], served["chosen"], served["guarded"]) == ([], FASTEST, True)
    in_process = seen(subprocess.run([sys.executable, str(PROBE), ALL, "--activate", str(cache)], env=clean_env(),
                                     capture_output=True, text=True, timeout=600))
    assert (in_process["benched"], in_process["chosen"], in_process["guarded"]) == ([], FASTEST, True)


def _member(bundles: dict, record: FileRecord) -> bytes:
    return next(blob for _, name, blob in archive.iter_members(bundles["tuned"]) if name == record.path)


def test_on_another_product_the_choices_are_skipped_with_one_line_and_the_kernels_installed(bundles, stub, tmp_path):
    cache = tmp_path / "cache"
    result, done = installed(bundles["tuned"], cache, stub, H100)
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warned == ["warning: autotune choices skipped: timed on NVIDIA H200, this GPU is NVIDIA H100 80GB HBM3; "
                      "the kernels are installed and Triton times the autotuned ones at first launch"]
    manifest = archive.read_manifest(bundles["tuned"])
    assert result["choices"] == "skipped" and result["action"] == "installed"
    assert all((cache / f.path).is_file() for f in manifest.files(choices=False))
    assert not list(cache.glob("*/*.autotune.json"))
    assert "TRITON_CACHE_AUTOTUNING" not in variables(cache)
    row = listed(cache)
    assert row["choices"] == 0 and row["choices_skipped"] == warned[0].removeprefix("warning: ")
    said = " ".join(kc("ls", "--cache-dir", str(cache), check=True).stdout.split())
    assert row["missing_files"] == 0 and "probe-sm_90-tuned: tuned on NVIDIA H200 (driver" in said
    assert f"{row['choices_skipped']}" in said
    again, done = installed(bundles["tuned"], cache, stub, H100)  # the no-op, from the checked record
    assert (again["action"], again["choices"]) == ("already-installed", "skipped") and warned[0] in done.stderr
    assert len(seen(kc("run", "--cache-dir", str(cache), "--", sys.executable, str(PROBE), ALL))["benched"]) == 3


def test_without_choices_the_served_environment_is_as_before(bundles, stub, tmp_path):
    cache = tmp_path / "cache"
    result, _ = installed(bundles["base"], cache, stub, H200)
    assert result["choices"] == ""
    found = variables(cache)
    assert not {"TRITON_CACHE_AUTOTUNING", "KERNELCACHE_AUTOTUNE_CHECK"} & set(found)


def test_merge_folds_choices_into_the_same_kernels_and_diff_lists_them(bundles, tmp_path):
    merged = tmp_path / "merged.tar.zst"
    kc("merge", str(bundles["base"]), str(bundles["tuned"]), "-o", str(merged), check=True)
    assert archive.read_manifest(merged).tuning == archive.read_manifest(bundles["tuned"]).tuning
    changes = json.loads(kc("diff", str(bundles["base"]), str(bundles["tuned"]), "--json").stdout)["entries"]
    assert [(c["change"], c["kind"], c["name"]) for c in changes] == [("added", "autotune", "scaled_copy")]
    elsewhere = tmp_path / "elsewhere.tar.zst"
    manifest = archive.read_manifest(bundles["tuned"])
    other = dataclasses.replace(manifest.tuning, product=H100.product)
    data = {name: blob for _, name, blob in archive.iter_members(bundles["tuned"])}
    archive.write(elsewhere, dataclasses.replace(manifest, tuning=other), [(n, lambda b=b: b) for n, b in data.items()])
    refused = kc("merge", str(bundles["tuned"]), str(elsewhere), "-o", str(tmp_path / "no.tar.zst"))
    assert refused.returncode == 61 and "timed on NVIDIA H200" in refused.stderr


def test_a_choice_inside_a_kernel_dir_is_refused(bundles, tmp_path):
    manifest = archive.read_manifest(bundles["tuned"])
    (record,) = manifest.tuning.files
    moved = f"{manifest.kernels[0].key}/scaled_copy.autotune.json"
    data = {(moved if name == record.path else name): blob for _, name, blob in archive.iter_members(bundles["tuned"])}
    tuning = dataclasses.replace(manifest.tuning, files=(dataclasses.replace(record, path=moved),))
    bad = archive.write(tmp_path / "bad.tar.zst", dataclasses.replace(manifest, tuning=tuning),
                        [(n, lambda b=b: b) for n, b in data.items()])
    done = kc("install", str(bad), "--cache-dir", str(tmp_path / "cache"), "--no-gpu-check")
    assert done.returncode == 16 and "shares its key dir" in done.stderr


def test_tune_refuses_without_a_gpu_of_the_bundle_profile(bundles, stub, tmp_path):
    none = kc("tune", str(bundles["base"]), "-o", str(tmp_path / "t.tar.zst"))
    assert none.returncode == 21 and "no GPU is visible" in none.stderr
    other = kc("tune", str(bundles["base"]), "-o", str(tmp_path / "t.tar.zst"), env=env_for(stub, B200))
    assert other.returncode == 21 and "none of the visible GPUs is one" in other.stderr
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    used = kc("tune", str(bundles["base"]), "--cache-dir", str(tmp_path / "used"), env=env_for(stub, H200))
    assert used.returncode == 2 and "must be absent or empty" in used.stderr
    assert not (tmp_path / "t.tar.zst").exists()


# A user's sitecustomize that runs the next one on sys.path, as the GPU harness's does (scripts/gpu/site/).
CHAINING = '''import importlib.machinery, importlib.util, os, sys
here = os.path.dirname(os.path.abspath(__file__))
os.environ["CHAINED_RUNS"] = str(int(os.environ.get("CHAINED_RUNS", "0")) + 1)
rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
if spec is not None:
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
'''


def test_a_sitecustomize_that_chains_back_runs_once_and_the_guard_is_on(tmp_path):
    """kernelcache's sitecustomize runs the one it shadows; one that runs the next on the path in turn finds
    kernelcache's again, which then does nothing: no recursion, each runs once, the guard is set once."""
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text(CHAINING)
    code = ("import os; import triton.runtime.autotuner as a; "
            "print(os.environ['CHAINED_RUNS'], getattr(a.Autotuner.check_disk_cache, 'kernelcache_guarded', False))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=clean_env(PYTHONPATH=f"{SITE_DIR}:{other}", KERNELCACHE_AUTOTUNE_CHECK="1"))
    assert done.stdout.split() == ["1", "True"] and "Error in sitecustomize" not in done.stderr, done.stderr[-2000:]
