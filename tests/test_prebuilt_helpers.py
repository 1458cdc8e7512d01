"""Triton's gcc-built helper modules come from the bundle where only a non-source part of their key differs.

Triton 3.6 keys ``cuda_utils`` and each ``__triton_launcher`` by ``sha256(source + platform_key())``, and
``platform_key()`` holds what file(1) says of the interpreter: a bundle built where ``file`` is installed missed
every one of them on an image without it, and Triton built them again with gcc. From 3.7 ``cuda_utils``'s key holds
the install paths, so it missed everywhere. ``hooks/kernelcache_prebuilt.py`` answers Triton's build step
with the bundle's module built from the same source. These tests run Triton's own ``CudaUtils()`` in processes
whose C compiler is ``/bin/false``: any real build fails, so a loaded module was taken from the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers.common import clean_env, kc

from kernelcache.format import archive
from kernelcache.hooks import kernelcache_prebuilt as kp

# Triton's driver start: its cuda_utils module, built (or found) against a stub libcuda.so.1 in argv[1].
PROBE = r"""
import ctypes, json, os, sys
os.environ["TRITON_LIBCUDA_PATH"] = sys.argv[1]
ctypes.CDLL(os.path.join(sys.argv[1], "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
from triton.backends.nvidia import driver
try:
    driver.CudaUtils()
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
served = getattr(sys.modules.get("kernelcache_prebuilt"), "SERVED", ())
print(json.dumps({"error": error, "served": sorted(os.path.basename(p) for p in served)}))
"""


def no_file_path(tmp_path: Path) -> str:
    """PATH with a ``file`` that fails first: CPython's platform.architecture() then reports no linkage."""
    bin_dir = tmp_path / "nofile"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "file").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "file").chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def probe(python: str, cache: Path, stub: Path, served: bool, **env: str) -> dict:
    """Run PROBE with ``cache`` as Triton's cache: under ``kernelcache run`` (``served``) or plainly."""
    command = [python, "-c", PROBE, str(stub)]
    if served:
        command = [python, "-m", "kernelcache", "run", "--cache-dir", str(cache), "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env=clean_env(TRITON_CACHE_DIR=str(cache), CC="/bin/false", **env))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def libcuda_stub(python: str, where: Path) -> Path:
    """A stub libcuda.so.1 for ``python``'s Triton (built with the real gcc, before CC turns false)."""
    code = "import sys; from kernelcache.exercise import fake_target as f; f.build_libcuda_stub(sys.argv[1])"
    subprocess.run([python, "-c", code, str(where)], check=True, env=clean_env(), timeout=300)
    return where


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Path:
    return libcuda_stub(sys.executable, tmp_path_factory.mktemp("stub"))


@pytest.fixture
def installed90(bundle90, stub, tmp_path) -> tuple[Path, Path]:
    """bundle90 freshly installed (each test sees only what it wrote itself), and the stub libcuda."""
    kc("install", str(bundle90), "--cache-dir", str(tmp_path / "cache"), check=True)
    return tmp_path / "cache", stub


def test_the_bundle_records_the_source_of_its_cuda_utils(bundle90):
    from triton.backends.nvidia import driver

    manifest = archive.read_manifest(bundle90)
    (module,) = [m for m in manifest.modules if m.kind == "cuda_utils"]
    record = next(f for f in module.files if f.path.endswith(kp.SOURCE_SUFFIX))
    driver_c = (Path(driver.__file__).parent / "driver.c").read_bytes()
    members = {name: data for _, name, data in archive.iter_members(bundle90)}
    assert members[record.path] == hashlib.sha256(driver_c).hexdigest().encode()


def test_without_file_the_served_process_takes_the_bundles_cuda_utils(installed90, tmp_path):
    cache, stub = installed90
    before = {p.name for p in cache.iterdir()}
    seen = probe(sys.executable, cache, stub, served=True, PATH=no_file_path(tmp_path))
    assert seen == {"error": None, "served": [f"cuda_utils{kp.suffix()}"]}
    assert len({p.name for p in cache.iterdir()} - before) == 1  # Triton kept it under the key it computed


def test_without_file_and_without_kernelcache_triton_misses_and_builds(installed90, tmp_path):
    cache, stub = installed90
    seen = probe(sys.executable, cache, stub, served=False, PATH=no_file_path(tmp_path))
    assert seen["served"] == [] and "CalledProcessError" in seen["error"]  # it ran CC=/bin/false


def test_with_file_the_bundles_key_is_hit_and_nothing_is_copied(installed90):
    cache, stub = installed90
    assert probe(sys.executable, cache, stub, served=True) == {"error": None, "served": []}


# -- the finder alone: only a byte-identical source is answered --------------------------------------------------


def built_module(root: Path, key: str, name: str, source: bytes, record: bool) -> Path:
    (root / key).mkdir(parents=True)
    (root / key / f"{name}{kp.suffix()}").write_bytes(b"module built from " + source)
    if record:
        (root / key / f"{name}{kp.SOURCE_SUFFIX}").write_text(hashlib.sha256(source).hexdigest())
    return root / key / f"{name}{kp.suffix()}"


@pytest.mark.fast
def test_a_recorded_source_is_found_and_any_other_byte_is_not(tmp_path):
    root, src = tmp_path / "cache", tmp_path / "driver.c"
    module = built_module(root, "K" * 52, "cuda_utils", b"int x;\n", record=True)
    finder = kp.Finder(str(root))
    src.write_bytes(b"int x;\n")
    assert finder.find("cuda_utils", str(src)) == str(module)
    assert finder.find("__triton_launcher", str(src)) is None  # another module's name
    src.write_bytes(b"int y;\n")
    assert finder.find("cuda_utils", str(src)) is None


@pytest.mark.fast
@pytest.mark.parametrize("linkage", ["ELF", ""])
def test_a_launcher_is_found_under_either_linkages_key(tmp_path, linkage):
    import platform
    import struct

    source = b"/* launcher */\n"
    variant = ",".join([platform.machine(), platform.system(), f"{struct.calcsize('P') * 8}bit", linkage])
    key = kp._dir_name(hashlib.sha256(source + variant.encode()).digest())
    module = built_module(tmp_path / "cache", key, "__triton_launcher", source, record=False)
    (tmp_path / "l.c").write_bytes(source)
    assert kp.Finder(str(tmp_path / "cache")).find("__triton_launcher", str(tmp_path / "l.c")) == str(module)


@pytest.mark.fast
@pytest.mark.parametrize("users_impl", [False, True])
def test_the_build_step_copies_only_without_a_build_impl_of_the_users(tmp_path, users_impl):
    root, src = tmp_path / "cache", tmp_path / "driver.c"
    built_module(root, "K" * 52, "cuda_utils", b"int x;\n", record=True)
    src.write_bytes(b"int x;\n")
    calls = []
    build = types.SimpleNamespace(knobs=types.SimpleNamespace(build=types.SimpleNamespace(impl=None)),
                                  _build=lambda *args, **kwargs: calls.append(args) or "built")
    build.knobs.build.impl = (lambda *a: None) if users_impl else None
    kp.activate(build, str(root))
    kp.activate(build, str(root))  # once per root
    out = tmp_path / "out"
    out.mkdir()
    result = build._build("cuda_utils", str(src), str(out), [], [], [], [])
    if users_impl:
        assert result == "built" and len(calls) == 1
    else:
        assert calls == [] and result == str(out / f"cuda_utils{kp.suffix()}") and kp.served_by_cache(result)
        assert Path(result).read_bytes() == b"module built from int x;\n"
    assert build._build.__wrapped__.__name__ == "<lambda>"


# A gcc build of a helper module through Triton's own build step, counted by kernelcache's listener.
COUNTED = r"""
import json, sys
from pathlib import Path
from triton.runtime import build
from kernelcache.format.compilelog import read
from kernelcache.hooks import kernelcache_listener

work, seen = Path(sys.argv[1]), []
kernelcache_listener.count_builds(str(work / "log.jsonl"), also=seen.append)
(work / "probe.c").write_text("int kernelcache_probe(void) { return 7; }\n")
so = build._build("kc_probe", str(work / "probe.c"), str(work), [], [], [], [])
print(json.dumps({"seen": seen, "logged": read(str(work / "log.jsonl")), "built": Path(so).is_file()}))
"""


def test_count_builds_hands_each_gcc_build_to_the_callback_and_the_log(tmp_path):
    """Scripts count Triton's gcc builds with ``count_builds(also=...)``, never by replacing Triton's ``_build``."""
    done = subprocess.run([sys.executable, "-c", COUNTED, str(tmp_path)], capture_output=True, text=True,
                          timeout=600, env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["built"]
    (record,) = found["seen"]
    assert (record["event"], record["name"]) == ("gcc", "kc_probe") and record["seconds"] > 0
    assert found["logged"] == found["seen"]
