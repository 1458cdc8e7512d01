"""CLI behaviour and exit codes; refusing bundles whose fingerprint would miss here."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.bundles import rewrite
from helpers.common import clean_env, kc, run_job

from kernelcache.errors import ArchMismatch, BundleFormatError, FingerprintMismatch, UsageError
from kernelcache.format.fingerprint import compare_gpu
from kernelcache.format.manifest import Target
from kernelcache.plan.gpus import VisibleGpu

BLOCK_HEAVY_IMPORTS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'triton', 'vllm', 'flashinfer'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import kernelcache, kernelcache.cli
print(kernelcache.__version__)
sys.argv = ['kernelcache', '--help']
kernelcache.cli.main()
"""


def test_import_and_help_need_no_torch_or_triton():
    done = subprocess.run([sys.executable, "-c", BLOCK_HEAVY_IMPORTS], capture_output=True, text=True,
                          env=clean_env())
    assert done.returncode == 0, done.stderr
    for verb in ("pack", "inspect", "install", "env", "run"):
        assert verb in done.stdout


VERBS_STAY_VERBS = r"""
import json, kernelcache
first = [callable(getattr(kernelcache, v)) for v in ("build", "install", "capture", "verify")]
from kernelcache.build import build  # the verb from its module, imported by name
import kernelcache.install, kernelcache.verify
again = [type(getattr(kernelcache, v)).__name__ for v in ("build", "install", "capture", "verify")]
print(json.dumps({"first": first, "again": again, "same": kernelcache.build is build}))
"""


def test_verbs_stay_verbs_when_their_modules_are_imported():
    """kernelcache.verify(...) twice in one process, or after `from kernelcache.verify import ...`: the verb."""
    done = subprocess.run([sys.executable, "-c", VERBS_STAY_VERBS], capture_output=True, text=True, env=clean_env())
    assert json.loads(done.stdout) == {"first": [True] * 4, "again": ["function"] * 4, "same": True}, done.stderr


def test_env_var_set_here_but_not_at_build_is_refused(bundle90, tmp_path):
    done = kc("install", str(bundle90), "--cache-dir", str(tmp_path / "c"),
              env={"TRITON_DEFAULT_FP_FUSION": "1"})
    assert done.returncode == FingerprintMismatch.exit_code
    assert "env_vars" in done.stderr and "TRITON_DEFAULT_FP_FUSION" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("kernelcache: error:")
    assert not (tmp_path / "c").exists()  # refused before anything was written


def test_forced_install_is_loud_and_really_misses(bundle90, tmp_path):
    cache = tmp_path / "c"
    done = kc("install", str(bundle90), "--cache-dir", str(cache), "--force", env={"TRITON_DEFAULT_FP_FUSION": "1"})
    assert done.returncode == 0 and "FORCED" in done.stderr
    _, replay = run_job(tmp_path / "w", cache, 90, env={"TRITON_DEFAULT_FP_FUSION": "1"})
    assert replay and not any(r["cache_hit"] for r in replay)


def test_other_python_and_triton_build_are_refused(bundle90, tmp_path):
    other = rewrite(bundle90, tmp_path / "other.tar.zst", python="cp399", triton_key_sha256="f" * 64)
    done = kc("install", str(other), "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == FingerprintMismatch.exit_code
    assert "cp399" in done.stderr and "triton_key_sha256" in done.stderr


def test_torch_version_alone_is_only_a_warning(bundle90, tmp_path):
    other = rewrite(bundle90, tmp_path / "t.tar.zst", torch="2.11.0+cu130")
    done = kc("install", str(other), "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == 0 and "torch" in done.stderr


def test_gpu_arch_and_sm_count_are_checked():
    target = Target("cuda", "sm_90", gpu="h200", sm_count=132)
    assert compare_gpu(target, [VisibleGpu(0, "NVIDIA H200", 90, 132)]) == []
    wrong_arch = compare_gpu(target, [VisibleGpu(0, "NVIDIA B200", 100, 148)])
    assert [d.field for d in wrong_arch] == ["gpu[0].arch"]
    wrong_sms = compare_gpu(target, [VisibleGpu(0, "NVIDIA H100 PCIe", 90, 114)])
    assert [d.field for d in wrong_sms] == ["gpu[0].sm_count"]
    assert compare_gpu(Target("cuda", "sm_90"), [VisibleGpu(0, "NVIDIA H100 PCIe", 90, 114)]) == []
    assert ArchMismatch.exit_code != FingerprintMismatch.exit_code


def test_inspect_table_and_json(bundle90):
    table = kc("inspect", str(bundle90), check=True).stdout
    assert "add_kernel" in table and "sm_90" in table and "launcher" in table
    data = json.loads(kc("inspect", str(bundle90), "--json", check=True).stdout)
    assert data["target"]["arch"] == "sm_90" and len(data["digest"]) == 64
    assert {k["name"] for k in data["kernels"]} == {"add_kernel", "scale_kernel", "row_max_kernel",
                                                    "gumbel_argmax_kernel"}


def test_exit_codes_for_bad_input(tmp_path):
    junk = tmp_path / "junk.tar.zst"
    junk.write_bytes(b"this is not a bundle")
    done = kc("inspect", str(junk))
    assert done.returncode == BundleFormatError.exit_code and "not a zstd" in done.stderr
    assert kc("inspect", str(tmp_path / "missing.tar.zst")).returncode == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    done = kc("pack", str(empty), "-o", str(tmp_path / "x.tar.zst"))
    assert done.returncode == UsageError.exit_code and "no complete Triton kernel" in done.stderr
    assert not (tmp_path / "x.tar.zst").exists()
    assert kc("run", "--cache-dir", str(tmp_path)).returncode == UsageError.exit_code
