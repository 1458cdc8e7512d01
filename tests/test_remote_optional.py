"""The transport extras stay optional: kernelcache imports and helps without them, and says what is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.common import clean_env

from kernelcache.errors import MissingDependency

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import kernelcache, kernelcache.cli, kernelcache.remote, kernelcache.bundle.compare
sys.argv = ['kernelcache', *{argv!r}]
kernelcache.cli.main()
"""
OPTIONAL = ("oras", "fsspec", "aiohttp", "requests", "yaml", "torch", "triton", "vllm", "flashinfer", "cryptography")


def run_blocked(*argv: str, blocked=OPTIONAL) -> subprocess.CompletedProcess:
    code = BLOCK.format(blocked=set(blocked), argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)


@pytest.mark.fast
def test_help_lists_the_fleet_commands_without_any_extra():
    done = run_blocked("--help")
    assert done.returncode == 0, done.stderr
    for verb in ("push", "pull", "diff", "merge", "install"):
        assert verb in done.stdout
    for verb in ("push", "pull", "diff", "merge"):
        assert run_blocked(verb, "--help").returncode == 0


def test_missing_extras_are_named(bundle90, tmp_path):
    done = run_blocked("push", str(bundle90), "oci://127.0.0.1:1/kc/x:v1", blocked={"oras"})
    assert done.returncode == MissingDependency.exit_code and "kernelcache[oci]" in done.stderr
    done = run_blocked("pull", "http://127.0.0.1:1/x.tar.zst", "-o", str(tmp_path), blocked={"fsspec"})
    assert done.returncode == MissingDependency.exit_code and "kernelcache[remote]" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_file_urls_and_diff_need_no_extra(bundle90, tmp_path):
    done = run_blocked("pull", bundle90.as_uri(), "-o", str(tmp_path), blocked={"oras", "fsspec", "requests"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / bundle90.name).read_bytes() == bundle90.read_bytes()
    done = run_blocked("diff", str(bundle90), str(bundle90), blocked={"oras", "fsspec", "requests"})
    assert done.returncode == 0 and "identical" in done.stdout


def test_signatures_need_the_sign_extra_only_where_one_is_checked(small_bundle, tmp_path):
    from helpers.keys import write_pair

    key, public, _ = write_pair(tmp_path, "k")
    bundle = tmp_path / "b.tar.zst"
    bundle.write_bytes(small_bundle.read_bytes())
    env_free = ["--cache-dir", str(tmp_path / "c"), "--no-gpu-check"]
    done = run_blocked("install", str(bundle), *env_free, blocked={"cryptography"})
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr  # unsigned: nothing to check
    done = run_blocked("sign", str(bundle), "--key", str(key), blocked={"cryptography"})
    assert done.returncode == MissingDependency.exit_code and "kernelcache[sign]" in done.stderr
    subprocess.run([sys.executable, "-m", "kernelcache", "sign", str(bundle), "--key", str(key)], check=True,
                   env=clean_env(), capture_output=True)
    done = run_blocked("install", str(bundle), *env_free, blocked={"cryptography"})
    assert done.returncode == 0 and "unverifiable: signatures need the cryptography package" in done.stderr
    done = run_blocked("install", str(bundle), *env_free, "--require-signature", "--trusted-key", str(public),
                       blocked={"cryptography"})
    assert done.returncode == MissingDependency.exit_code and "kernelcache[sign]" in done.stderr
