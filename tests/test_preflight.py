"""A build checks its environment before its first exercise process (kernelcache/preflight.py): a broken one fails
in seconds with the cause, the fix and its own exit code, and leaves no scratch dir and no output dir behind.

The environments are real: a venv uv makes from its cache (no vLLM in it), a stub ``vllm`` package that raises on
import, and the cuda-python 12.6 wheel installed over cuda-bindings 13.5 as ``uv pip install vllm==0.33.0`` does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.common import ROOT, clean_env
from helpers.wheel import uv

from kernelcache.errors import ImportFailed, MissingDependency, PackageClash
from kernelcache.plan.recipe import PlanOverrides, load
from kernelcache.preflight import CHECKS, installed_key, preflight

SMALL = ("build", "--arch", "sm_90", "--gpu", "h200", "--vocab", "32000", "--mode", "cross")
CUDA_BINDINGS, CUDA_PYTHON = "13.5.0", "12.6.2.post1"  # what `uv pip install vllm==0.33.0` resolves


def plain_venv(where: Path, *packages: str) -> Path:
    """A uv venv on this interpreter with kernelcache's own dependencies and ``packages``; kernelcache itself comes
    from the checkout through PYTHONPATH."""
    uv("venv", "-q", "--python", sys.executable, str(where))
    uv("pip", "install", "-q", "--python", str(where / "bin" / "python"), "click>=8.1", "filelock>=3.12",
       "zstandard>=0.22", "rich>=13", *packages)
    return where


def build_in(python: Path, tmp: Path, *args: str, pythonpath: str = "") -> tuple[subprocess.CompletedProcess, float]:
    """``kernelcache build ARGS`` with ``python``, from ``tmp``, its temp dir ``tmp/t`` (where a scratch dir goes)."""
    (tmp / "t").mkdir(exist_ok=True)
    env = clean_env(TMPDIR=str(tmp / "t"), PYTHONPATH=":".join(filter(None, (pythonpath, str(ROOT)))),
                    XDG_CACHE_HOME=str(tmp / "xdg"))
    started = time.monotonic()
    done = subprocess.run([str(python), "-m", "kernelcache", *args, "-o", str(tmp / "out" / "bundles")], cwd=tmp,
                          env=env, capture_output=True, text=True, timeout=900)
    return done, time.monotonic() - started


def nothing_left(tmp: Path) -> None:
    assert list((tmp / "t").iterdir()) == []  # no kernelcache-build-* scratch dir
    assert not (tmp / "out").exists()  # nor the output dir it would have made


def stub_vllm(site: Path, init: str = "") -> Path:
    """A ``vllm`` 0.33.0 (its metadata) whose files the registry and flashinfer paths need are found on disk (the
    modules the families require and their contact points there), and a ``flashinfer`` package."""
    from kernelcache.plan import families, releases

    paths = ("registry", "flashinfer")
    modules = {families.get(p).about.requires[0] for p in paths}
    modules |= {c.module for p in paths for c in releases.current(families.get(p).about.contacts, "0.33.0")}
    site.mkdir(parents=True, exist_ok=True)
    for module in sorted(m for m in modules if m.startswith("vllm.")):
        parts = module.split(".")
        for depth in range(1, len(parts)):
            folder = site.joinpath(*parts[:depth])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
        leaf = site.joinpath(*parts)
        if not leaf.is_dir():
            leaf.with_suffix(".py").touch()
    (site / "flashinfer").mkdir(exist_ok=True)
    (site / "flashinfer" / "__init__.py").touch()
    (site / "vllm" / "__init__.py").write_text(init)
    info = site / "vllm-0.33.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    return site


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    return plain_venv(tmp_path_factory.mktemp("bare") / "venv")


def test_a_build_without_vllm_exits_30_in_seconds_and_leaves_nothing(bare, tmp_path):
    done, _ = build_in(bare / "bin" / "python", tmp_path, *SMALL, "--path", "registry")
    assert done.returncode == MissingDependency.exit_code == 30, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert "vLLM is not installed in" in line and "pip install vllm" in line
    nothing_left(tmp_path)


def test_a_vllm_that_does_not_import_exits_34_naming_its_error(tmp_path):
    site = stub_vllm(tmp_path / "site", "raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    done, _ = build_in(Path(sys.executable), tmp_path, *SMALL, "--path", "registry", pythonpath=str(site))
    assert done.returncode == ImportFailed.exit_code == 34, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert "vllm is installed but does not import" in line and "libcudart.so.13: cannot open" in line
    nothing_left(tmp_path)


@pytest.fixture(scope="module")
def clashing(tmp_path_factory) -> Path:
    """cuda-bindings 13.5.0, then cuda-python 12.6.2.post1's wheel over it: its cuda/bindings/ replaces files of
    cuda-bindings (the order uv's parallel install can end in; --no-deps, as cuda-python 12.6 would pull 12.x)."""
    venv = plain_venv(tmp_path_factory.mktemp("clash") / "venv", f"cuda-bindings=={CUDA_BINDINGS}")
    uv("pip", "install", "-q", "--no-deps", "--python", str(venv / "bin" / "python"), f"cuda-python=={CUDA_PYTHON}")
    return venv


def test_cuda_python_over_cuda_bindings_exits_35_with_both_versions_and_the_fix(clashing, tmp_path):
    site = stub_vllm(tmp_path / "site")
    done, _ = build_in(clashing / "bin" / "python", tmp_path, *SMALL, "--path", "flashinfer", pythonpath=str(site))
    assert done.returncode == PackageClash.exit_code == 35, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert f"cuda-python {CUDA_PYTHON} overwrote" in line and f"cuda-bindings {CUDA_BINDINGS}" in line
    fix = f"uv pip install --reinstall-package cuda-bindings cuda-bindings=={CUDA_BINDINGS}"
    assert fix in line
    nothing_left(tmp_path)


def test_the_clash_is_checked_only_where_the_plan_imports_flashinfer():
    [row] = [c for c in CHECKS if c.name == "no package clash"]
    for paths, wanted in ((("registry",), False), (("flashinfer",), True), (("flashinfer_attention",), True)):
        assert row.applies(SimpleNamespace(paths=paths), ()) is wanted


def test_the_fix_the_clash_names_repairs_it(clashing, tmp_path):
    probe = "import json; from kernelcache.preflight import overwritten; print(len(overwritten('cuda-bindings', " \
            "'cuda-python')))"

    def replaced() -> int:
        done = subprocess.run([str(clashing / "bin" / "python"), "-c", probe], env=clean_env(PYTHONPATH=str(ROOT)),
                              capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    assert replaced() > 0
    uv("pip", "install", "-q", "--python", str(clashing / "bin" / "python"), "--reinstall-package", "cuda-bindings",
       f"cuda-bindings=={CUDA_BINDINGS}")
    assert replaced() == 0


def test_a_failed_exercise_leaves_its_log_and_no_scratch_or_output_dir(tmp_path):
    """A build that fails after the preflight (here: the stub vLLM imports but its modules are empty) removes its
    scratch dir and the output dir it made; the logs its error names are kept in one file beside where the scratch
    dir was."""
    site = stub_vllm(tmp_path / "site")
    done, _ = build_in(Path(sys.executable), tmp_path, *SMALL, "--path", "registry", pythonpath=str(site))
    assert done.returncode == 51, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    [log] = (tmp_path / "t").iterdir()
    assert log.name.startswith("kernelcache-build-") and log.suffix == ".log" and str(log) in line
    assert '"ok": false' in log.read_text() and "Traceback" in log.read_text()  # the exercise's own result
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # imports vLLM twice (a minute on a loaded 2-core box)
def test_a_pass_is_remembered_until_a_distribution_changes(tmp_path, monkeypatch):
    plan = load(None).override(PlanOverrides(paths=("registry",), gpus=("h200",), vocabs=(32000,)))
    memory = tmp_path / "preflight"
    first = preflight(plan, (), memory=memory)
    assert "imports" in first.ran and not first.remembered
    second = preflight(plan, (), memory=memory)
    assert "imports" not in second.ran and second.remembered == ("imports",)
    site = tmp_path / "site"
    (site / "newpkg-1.0.dist-info").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    third = preflight(plan, (), memory=memory)
    assert "imports" in third.ran  # another distribution is installed: checked again


def test_the_installed_key_changes_with_a_reinstall(tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "pkg-1.0.dist-info"
    info.mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    before = installed_key()
    info.rmdir()
    time.sleep(0.01)
    info.mkdir()  # what --reinstall-package does: the same name, a new directory
    assert installed_key() != before


def test_a_failure_is_not_remembered(tmp_path, monkeypatch):
    site = stub_vllm(tmp_path / "site", "raise RuntimeError('broken')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    plan = load(None).override(PlanOverrides(paths=("registry",), gpus=("h200",), vocabs=(32000,)))
    for _ in range(2):
        with pytest.raises(ImportFailed, match="RuntimeError: broken"):
            preflight(plan, (), memory=tmp_path / "preflight")
    assert not (tmp_path / "preflight").exists() or not any((tmp_path / "preflight").iterdir())


def test_the_toolchain_row_applies_only_to_a_flashinfer_path():
    from kernelcache.plan.targets import plan_targets

    [row] = [c for c in CHECKS if c.name == "flashinfer toolchain"]
    for paths, wanted in ((("registry",), False), (("registry", "flashinfer"), True)):
        plan = load(None).override(PlanOverrides(paths=paths, gpus=("h200",), vocabs=(32000,)))
        assert row.applies(plan, plan_targets(plan, "sm_90", "cross", [])) is wanted


def test_a_cross_target_without_flashinfer_modules_fetches_no_toolchain(tmp_path):
    """build.py asks for the toolchain's CUDA version only for a FlashInfer module it takes (a build without the
    FlashInfer path fetched 150 MB of CUDA wheels for nothing)."""
    code = ("from kernelcache.build import flashinfer_attention_modules as f; from kernelcache.plan.targets import "
            "BuildTarget; from kernelcache.plan.gpus import profile; "
            "print(f((), BuildTarget('sm_90', 132, (profile('h200'),), 'cross')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=clean_env(KERNELCACHE_TOOLCHAIN_DIR=str(tmp_path / "tc"), PYTHONPATH=str(ROOT)))
    assert done.returncode == 0 and done.stdout.strip() == "((), ())", done.stderr[-2000:]
    assert not (tmp_path / "tc").exists() and "fetching" not in done.stderr
