"""The loader: env exports, run (exec) and activate reach child processes."""

from __future__ import annotations

import subprocess
import sys

from conftest import clean_env, kc, run_job

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
    code = ("import kernelcache, sys; kernelcache.activate(sys.argv[1], cache_dir=sys.argv[2]); "
            "import os; print(os.environ['TRITON_CACHE_DIR'])")
    cache = tmp_path / "c"
    done = subprocess.run([sys.executable, "-c", code, str(bundle90), str(cache)], capture_output=True, text=True,
                          env=clean_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(cache)
    _, replay = run_job(tmp_path / "w", cache, 90)
    assert replay and all(r["cache_hit"] for r in replay)


def test_activate_refuses_when_triton_is_already_pinned(tmp_path):
    code = ("import triton, kernelcache; triton.knobs.cache.dir = '/somewhere/else'\n"
            "from kernelcache.errors import AlreadyActivated\n"
            f"try:\n    kernelcache.activate(cache_dir={str(tmp_path / 'c')!r})\n"
            "except AlreadyActivated as e:\n    print('refused', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert done.stdout.startswith("refused") and "/somewhere/else" in done.stdout
