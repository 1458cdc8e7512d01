"""The loader: env exports, run (exec) and activate reach child processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.common import clean_env, kc, run_job

import kernelcache
from kernelcache.errors import UsageError

PRINT_CHILD = ("import os, subprocess, sys; print(subprocess.run([sys.executable, '-c', "
               "'import os; print(os.environ[\"TRITON_CACHE_DIR\"])'], capture_output=True, text=True).stdout)")


def test_env_prints_exports(tmp_path):
    done = kc("env", "--cache-dir", str(tmp_path / "c"), check=True)
    assert done.stdout == f"export TRITON_CACHE_DIR={tmp_path / 'c'}\n"
    shell = subprocess.run(["bash", "-c", f'eval "$({sys.executable} -m kernelcache env --cache-dir {tmp_path}/c)"; '
                            'echo "$TRITON_CACHE_DIR"'], capture_output=True, text=True, env=clean_env())
    assert shell.stdout.strip() == str(tmp_path / "c")


def test_default_cache_dir_follows_kernelcache_home_then_triton(tmp_path):
    assert kc("env", env={"KERNELCACHE_HOME": str(tmp_path / "k"), "TRITON_CACHE_DIR": "/x"},
              check=True).stdout.strip().endswith(str(tmp_path / "k"))
    assert kc("env", env={"TRITON_CACHE_DIR": str(tmp_path / "t")}, check=True).stdout.strip().endswith(
        str(tmp_path / "t"))
    assert kc("env", env={"HOME": str(tmp_path)}, check=True).stdout.strip().endswith(
        str(tmp_path / ".triton" / "cache"))


def test_run_installs_then_execs_with_the_cache_reaching_grandchildren(bundle90, tmp_path):
    cache = tmp_path / "c"
    done = kc("run", "--bundle", str(bundle90), "--cache-dir", str(cache), "--", sys.executable, "-c", PRINT_CHILD,
              check=True)
    assert done.stdout.strip() == str(cache)
    assert any(cache.glob("*/__grp__add_kernel.json"))


def test_run_passes_the_exit_code_through(tmp_path):
    done = kc("run", "--cache-dir", str(tmp_path), "--", sys.executable, "-c", "raise SystemExit(7)")
    assert done.returncode == 7


def test_activate_in_process_then_kernels_hit(bundle90, tmp_path):
    code = ("import kernelcache, sys; kernelcache.activate(bundle=sys.argv[1], cache_dir=sys.argv[2]); "
            "import os; print(os.environ['TRITON_CACHE_DIR'])")
    cache = tmp_path / "c"
    done = subprocess.run([sys.executable, "-c", code, str(bundle90), str(cache)], capture_output=True, text=True,
                          env=clean_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(cache)
    _, replay = run_job(tmp_path / "w", cache, 90)
    assert replay and all(r["cache_hit"] for r in replay)


def test_activate_refuses_when_triton_is_already_pinned(tmp_path):
    (tmp_path / "c").mkdir()
    code = ("import triton, kernelcache; triton.knobs.cache.dir = '/somewhere/else'\n"
            "from kernelcache.errors import AlreadyActivated\n"
            f"try:\n    kernelcache.activate(cache_dir={str(tmp_path / 'c')!r})\n"
            "except AlreadyActivated as e:\n    print('refused', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert done.stdout.startswith("refused") and "/somewhere/else" in done.stdout


@pytest.mark.fast
@pytest.mark.parametrize("call", [
    lambda tmp: kernelcache.activate(bundle=tmp / "typo" / "bundle.tar.zst"),
    lambda tmp: kernelcache.activate(bundle=tmp),  # a directory is not a bundle
    lambda tmp: kernelcache.activate(cache_dir=tmp / "typo"),
    lambda tmp: kernelcache.activate(bundle=tmp / "typo.tar.zst", cache_dir=tmp / "c"),
], ids=["missing-bundle", "dir-as-bundle", "missing-cache-dir", "missing-bundle-with-cache-dir"])
def test_activate_refuses_a_path_that_does_not_exist(call, tmp_path, monkeypatch):
    """A mistyped path used to come back as TRITON_CACHE_DIR: a silent cold start (issue 13, defect 2)."""
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    with pytest.raises(UsageError, match="does not exist"):
        call(tmp_path)
    assert "TRITON_CACHE_DIR" not in os.environ
    assert not (tmp_path / "c").exists()


@pytest.mark.fast
def test_activate_takes_no_positional_path():
    """The API never guesses whether a path is a bundle or a cache dir."""
    with pytest.raises(TypeError):
        kernelcache.activate("/bundles/b.tar.zst")  # type: ignore[misc]
