"""FlashInfer's sampling module: one real cross build for sm_90, then bundle, install, and FlashInfer's
own lookup resolving to the installed file with FLASHINFER_DISABLE_JIT=1 (resolution and dlopen,
not a launch: there is no GPU here). ``FLASHINFER_CUDA_ARCH_LIST`` stands in for the arch FlashInfer
would read from the GPU; a tripwire ``nvcc``/``ninja`` first on PATH records any compile attempt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers.common import clean_env, kc
from helpers.flashinfer import flashinfer_bundle, probe, require_flashinfer

from kernelcache.errors import (
    BuildFailed,
    FingerprintMismatch,
    IntegrityError,
    MissingDependency,
    UsageError,
)
from kernelcache.exercise.flashinfer_sampling import (
    CUDA_VERSION,
    build_sampling,
    cubin_archs,
    find_toolchain,
    harvest_sampling,
)
from kernelcache.format.fingerprint import compare_flashinfer, package_version
from kernelcache.format.manifest import Build, Environment, FlashInferModule, Manifest, Target

pytestmark = pytest.mark.flashinfer
NO_GPU = {"KERNELCACHE_NO_GPU_PROBE": "1"}
EXPORTS = {"top_k_sampling_from_probs", "top_p_sampling_from_probs", "top_k_mask_logits", "softmax"}


def libcudart():
    return find_toolchain().root / "lib" / "libcudart.so.13"


def installed(bundle, cache, **env):
    kc("install", str(bundle), "--cache-dir", str(cache), env={**NO_GPU, **env}, check=True)
    return json.loads(kc("env", "--cache-dir", str(cache), "--json", env=env, check=True).stdout)


@pytest.fixture(scope="module")
def bundle(sampling90, tmp_path_factory):
    module, members, _ = sampling90
    return flashinfer_bundle(tmp_path_factory.mktemp("fi-bundle") / "fi-sm_90.tar.zst", module, members)


# -- the build --------------------------------------------------------------------------------------


def test_cross_build_is_an_elf_with_sm90a_sass_only(sampling90, tmp_path):
    module, members, _ = sampling90
    assert (module.name, module.archs, module.cuda) == ("sampling", ("sm90a",), CUDA_VERSION)
    assert module.version == package_version("flashinfer-python")
    assert module.tvm_ffi == package_version("apache-tvm-ffi")
    [member] = members
    assert re.fullmatch(rf"flashinfer/{re.escape(module.version)}-90a-[0-9a-f]{{12}}/sampling/sampling\.so",
                        member.path)
    library = tmp_path / "sampling.so"
    library.write_bytes(member.read())
    header = subprocess.run(["readelf", "-h", str(library)], capture_output=True, text=True, check=True).stdout
    assert "DYN (Shared object file)" in header and "X86-64" in header
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic))
    assert "libcudart.so.13" in needed and not any(n.startswith("libcuda.so") for n in needed)
    symbols = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], capture_output=True, text=True,
                             check=True).stdout
    assert {f"__tvm_ffi_{name}" for name in EXPORTS} <= set(re.findall(r"\b(__tvm_ffi_\w+)\b", symbols))
    assert cubin_archs(library, find_toolchain().cuobjdump) == (["sm_90a"], [])


def test_native_mode_takes_the_module_a_jit_dir_holds(sampling90, tmp_path):
    module, members, workdir = sampling90
    jit_dir = workdir / ".cache" / "flashinfer" / module.version / "90a" / "cached_ops"
    native, taken = harvest_sampling(jit_dir, "sm_90")
    assert native == module
    assert [(m.path, m.read()) for m in taken] == [(m.path, m.read()) for m in members]
    with pytest.raises(UsageError, match="not sm_100"):
        harvest_sampling(jit_dir, "sm_100")
    other = tmp_path / ".cache" / "flashinfer" / "0.6.0" / "90a" / "cached_ops"
    shutil.copytree(jit_dir / "sampling", other / "sampling")
    with pytest.raises(UsageError, match="built by flashinfer 0.6.0"):
        harvest_sampling(other)
    with pytest.raises(UsageError, match="holds no sampling"):
        harvest_sampling(tmp_path)
    debug = tmp_path / "debug" / module.version / "90a" / "cached_ops"
    shutil.copytree(jit_dir / "sampling", debug / "sampling")
    ninja = debug / "sampling" / "build.ninja"
    ninja.write_text(ninja.read_text().replace("-O3", "-O0 -g --device-debug"))
    with pytest.raises(UsageError, match="debug build"):
        harvest_sampling(debug)


def test_build_failure_is_one_line_naming_the_log(tmp_path):
    require_flashinfer()
    with pytest.raises(BuildFailed, match=r"sm75 or higher.*full log: .*flashinfer-build\.log"):
        build_sampling("sm_70", tmp_path)
    with pytest.raises(UsageError, match="not a CUDA arch"):
        build_sampling("gfx90a", tmp_path)


def test_missing_toolchain_names_the_fix(tmp_path):
    with pytest.raises(MissingDependency, match="setup_toolchain"):
        find_toolchain(tmp_path)


# -- bundle, install, resolve -----------------------------------------------------------------------


def test_manifest_records_versions_and_archs(bundle, sampling90):
    module, members, _ = sampling90
    data = json.loads(kc("inspect", str(bundle), "--json", check=True).stdout)
    [record] = data["flashinfer"]
    assert {k: record[k] for k in ("name", "version", "cuda", "archs", "tvm_ffi")} == {
        "name": "sampling", "version": module.version, "cuda": CUDA_VERSION, "archs": ["sm90a"],
        "tvm_ffi": module.tvm_ffi}
    assert [f["path"] for f in record["files"]] == [members[0].path]
    assert data["kernels"] == [] and data["modules"] == []


def test_build_of_the_flashinfer_path_alone_bundles_just_the_module(sampling90):
    module, members, workdir = sampling90
    if os.environ.get("KERNELCACHE_TEST_FLASHINFER_WORKDIR"):
        pytest.skip("the sampling90 fixture reused a kept build dir instead of running kernelcache build")
    bundle = workdir.parents[2] / "out" / "vllm-sampler-sm_90-h200.tar.zst"
    data = json.loads(kc("inspect", str(bundle), "--json", check=True).stdout)
    assert data["kernels"] == [] and data["modules"] == [] and data["build"]["plan"]["paths"] == ["flashinfer"]
    [record] = data["flashinfer"]
    assert record["archs"] == ["sm90a"] and record["version"] == module.version
    [file] = record["files"]
    assert file["path"] == members[0].path
    built = members[0].data if members[0].data is not None else members[0].source.read_bytes()
    assert file["sha256"] == hashlib.sha256(built).hexdigest()
    assert data["environment"]["triton"] == package_version("triton") and data["target"]["arch"] == "sm_90"


def test_a_second_build_takes_the_module_from_the_build_cache_instead_of_running_nvcc(sampling90, tmp_path):
    _, _, workdir = sampling90
    if os.environ.get("KERNELCACHE_TEST_FLASHINFER_WORKDIR"):
        pytest.skip("the sampling90 fixture reused a kept build dir instead of running kernelcache build")
    scratch, name = workdir.parents[2], "vllm-sampler-sm_90-h200.tar.zst"
    done = kc("build", "--arch", "sm_90", "--gpu", "h200", "--path", "flashinfer", "--mode", "cross", "--workdir",
              str(tmp_path / "work"), "-o", str(tmp_path / "out"), "--build-cache", str(scratch / "build-cache"),
              "--json", check=True, timeout=1800)
    [target] = json.loads(done.stdout)
    assert target["build_cache"]["flashinfer"] == "reused"
    assert not (tmp_path / "work" / "sm_90-132sm" / "flashinfer").exists()  # nvcc's build never ran
    assert (tmp_path / "out" / name).read_bytes() == (scratch / "out" / name).read_bytes()


def test_flashinfer_resolves_to_the_installed_file_with_jit_disabled(bundle, sampling90, tmp_path):
    module, members, _ = sampling90
    cache = tmp_path / "cache"
    variables = installed(bundle, cache)
    assert variables["FLASHINFER_DISABLE_JIT"] == "1"
    result, compiles = probe(variables, libcudart(), tmp_path, FLASHINFER_CUDA_ARCH_LIST="9.0a",
                             HOME=str(tmp_path / "home"))
    assert result["artifacts"] == [str(cache / members[0].path)]
    assert set(result["loaded"]) >= EXPORTS
    assert compiles == []
    assert not (tmp_path / "home" / ".cache" / "flashinfer" / module.version / "90a" / "cached_ops" /
                "sampling").exists()


def test_verify_checks_a_flashinfer_only_bundle_through_flashinfer(sampling90, bundle, tmp_path):
    """A FlashInfer-only bundle runs no exercise task; verify used to pass it with 0 hits, checking nothing."""
    module, members, workdir = sampling90
    bundles = [bundle]  # no recorded plan
    if not os.environ.get("KERNELCACHE_TEST_FLASHINFER_WORKDIR"):
        bundles.append(workdir.parents[2] / "out" / "vllm-sampler-sm_90-h200.tar.zst")  # plan: paths flashinfer
    for i, path in enumerate(bundles):
        cache = tmp_path / f"cache{i}"
        done = kc("verify", str(path), "--cache-dir", str(cache), "--json",
                  env={**NO_GPU, "HOME": str(tmp_path / "home")})
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout)
        [check] = report["flashinfer"]
        assert report["ok"] and report["tasks"] == 0 and not report["nothing_verified"]
        assert check["artifacts"] == [str(cache / members[0].path)]
        assert check["found"] and check["loaded"] and not check["on_gpu"] and not check["called"]


def test_another_arch_fails_loudly_instead_of_compiling(bundle, tmp_path):
    variables = installed(bundle, tmp_path / "cache")
    result, compiles = probe(variables, libcudart(), tmp_path, FLASHINFER_CUDA_ARCH_LIST="10.0a",
                             HOME=str(tmp_path / "home"))
    assert result["artifacts"] == [] and result["error"].startswith("MissingJITCacheError")
    assert compiles == []


def test_activate_in_process_reaches_flashinfer_and_refuses_when_too_late(bundle, tmp_path):
    code = ("import kernelcache, sys; kernelcache.activate(bundle=sys.argv[1], cache_dir=sys.argv[2])\n"
            "import json, flashinfer.jit.env as e\n"
            "print(json.dumps([str(p.jit_cache_dir) for p in e.FLASHINFER_AOT_PROVIDERS]))\n")
    env = clean_env(**NO_GPU, FLASHINFER_CUDA_ARCH_LIST="9.0a", HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, "-c", code, str(bundle), str(tmp_path / "c")], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    [provider_dir] = json.loads(done.stdout.strip().splitlines()[-1])
    assert provider_dir.startswith(str(tmp_path / "c" / "flashinfer"))
    late = "import flashinfer, kernelcache, sys; kernelcache.activate(cache_dir=sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", late, str(tmp_path / "c")], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "AlreadyActivated" in done.stderr


def test_env_keeps_the_users_choices(bundle, tmp_path):
    user = {"PYTHONPATH": "/opt/mine", "FLASHINFER_DISABLE_JIT": "", "FLASHINFER_WORKSPACE_BASE": "/scratch"}
    variables = installed(bundle, tmp_path / "cache", **user)
    assert variables["PYTHONPATH"].split(":")[-1] == "/opt/mine"
    assert "FLASHINFER_DISABLE_JIT" not in variables and "FLASHINFER_WORKSPACE_BASE" not in variables
    again = json.loads(kc("env", "--cache-dir", str(tmp_path / "cache"), "--json",
                          env={"PYTHONPATH": variables["PYTHONPATH"]}, check=True).stdout)
    assert again["PYTHONPATH"] == variables["PYTHONPATH"]  # no second copy of kernelcache's dirs


def test_a_real_flashinfer_jit_cache_shim_is_not_shadowed(bundle, tmp_path):
    other = tmp_path / "site" / "flashinfer_jit_cache"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    variables = installed(bundle, tmp_path / "cache", PYTHONPATH=str(tmp_path / "site"))
    entries = variables["PYTHONPATH"].split(":")
    assert entries[0].endswith("/providers") and not any(e.endswith("/shim") for e in entries)


def test_unwritable_home_gets_a_writable_workspace(bundle, tmp_path):
    (tmp_path / "file").write_text("")  # a HOME below a file cannot be created, even by root
    variables = installed(bundle, tmp_path / "cache", HOME=str(tmp_path / "file" / "home"))
    assert variables["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "cache" / ".kernelcache" / "flashinfer" /
                                                         "workspace")
    assert "FLASHINFER_WORKSPACE_BASE" not in installed(bundle, tmp_path / "c2", HOME=str(tmp_path / "home"))


def test_installed_file_changed_is_refused_by_env(bundle, sampling90, tmp_path):
    _, members, _ = sampling90
    cache = tmp_path / "cache"
    installed(bundle, cache)  # its env kept the variables (runtime/served.py): the change must not be hidden by them
    assert list((cache / ".kernelcache" / "served").glob("*.json"))
    library = cache / members[0].path
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))
    done = kc("env", "--cache-dir", str(cache))
    assert done.returncode == IntegrityError.exit_code
    assert "does not match the sha256" in done.stderr and done.stdout == ""


def test_other_flashinfer_version_is_refused_at_install_and_at_env(sampling90, tmp_path):
    module, members, _ = sampling90
    bundle = flashinfer_bundle(tmp_path / "old.tar.zst", module, members, version="0.6.0")
    cache = tmp_path / "cache"
    done = kc("install", str(bundle), "--cache-dir", str(cache), env=NO_GPU)
    assert done.returncode == FingerprintMismatch.exit_code and "flashinfer[sampling]" in done.stderr
    assert not cache.exists()
    kc("install", str(bundle), "--cache-dir", str(cache), "--force", env=NO_GPU, check=True)
    done = kc("env", "--cache-dir", str(cache))
    assert done.returncode == FingerprintMismatch.exit_code and "built for flashinfer 0.6.0" in done.stderr


def test_flashinfer_only_bundle_ignores_the_triton_fingerprint(sampling90, tmp_path):
    module, members, _ = sampling90
    bundle = flashinfer_bundle(tmp_path / "fi.tar.zst", module, members)
    from kernelcache.format import archive

    manifest = archive.read_manifest(bundle)
    moved = dataclasses.replace(manifest, environment=dataclasses.replace(
        manifest.environment, python="cp399", triton="0.0.1", triton_key_sha256="0" * 64, ptxas={}),
        triton_identity=None)
    data = {name: blob for _, name, blob in archive.iter_members(bundle)}
    archive.write(tmp_path / "moved.tar.zst", moved, [(n, lambda b=b: b) for n, b in data.items()])
    kc("install", str(tmp_path / "moved.tar.zst"), "--cache-dir", str(tmp_path / "c"), env=NO_GPU, check=True)


# -- the checks FlashInfer does not make (pure) -----------------------------------------------------


def manifest_with(arch: str = "sm_90", **module_changes) -> Manifest:
    module = FlashInferModule("sampling", "0.7.2.post1", "13.0.88", ("sm90a",), "0.1.11", ())
    env = Environment("cp312", "x86_64-linux", None, None)
    return Manifest(Target("cuda", arch), env, Build("kernelcache", "cross"),
                    flashinfer=(dataclasses.replace(module, **module_changes),))


@pytest.mark.parametrize(("manifest", "torch", "tvm_ffi", "expected"), [
    (manifest_with(), "2.11.0+cu130", "0.1.11", []),
    (manifest_with(), "2.13.0+cpu", "0.1.11", []),
    (manifest_with(), "2.11.0+cu128", "0.1.11", [("flashinfer[sampling].cuda", True)]),
    (manifest_with(), "2.11.0+cu130", "0.1.12", [("flashinfer[sampling].tvm_ffi", False)]),
    (manifest_with(), "2.11.0+cu130", "0.2.0", [("flashinfer[sampling].tvm_ffi", True)]),
    (manifest_with("sm_100"), "2.11.0", "0.1.11", [("flashinfer[sampling].archs", True)]),
    (manifest_with(version="0.7.4"), None, None, [("flashinfer[sampling]", True)]),
])
def test_compare_flashinfer(manifest, torch, tvm_ffi, expected):
    found = compare_flashinfer(manifest, "0.7.2.post1", torch, tvm_ffi)
    assert [(d.field, d.blocking) for d in found] == expected


def test_compare_flashinfer_without_flashinfer_here_is_only_a_note():
    [note] = compare_flashinfer(manifest_with(), None, "2.11.0+cu130", None)
    assert not note.blocking
