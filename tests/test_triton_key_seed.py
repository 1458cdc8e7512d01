"""A served process takes the ``triton_key()`` its install computed, only while Triton's files are unchanged.

``triton_key()`` hashes libtriton.so (about 400 MB) on the first compile or cache lookup of every process.
The install that computed it keeps it in ``<cache>/.kernelcache/triton-keys/``; ``env`` / ``run`` /
``activate()`` point served processes at it (hooks/kernelcache_tritonkey.py). These tests show the
kept value equals Triton's own, that libtriton.so is then not read at all, and that any change to a file
the key is computed from (or a record of another Triton) falls back to Triton's computation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers.common import ROOT, SERVED, clean_env, kc

from kernelcache.hooks import kernelcache_tritonkey as tk

SITE = ROOT / "kernelcache" / "hooks"


def fake_triton(root: Path) -> types.SimpleNamespace:
    """A Triton tree with one file of each kind triton_key() reads, and its cache module."""
    for rel in ("__init__.py", "runtime/cache.py", "compiler/compiler.py", "backends/nvidia/driver.py",
                "language/core.py", "_C/libtriton.so"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    calls = []

    def triton_key():
        calls.append(1)
        return "computed"

    return types.SimpleNamespace(__file__=str(root / "runtime" / "cache.py"), triton_key=triton_key, calls=calls)


@pytest.mark.fast
def test_kept_key_is_returned_while_every_file_is_unchanged(tmp_path):
    root, folder = tmp_path / "triton", tmp_path / "keys"
    module = fake_triton(root)
    tk.save_key(str(folder), tk.triton_root(module), "kept", tk.triton_files(str(root)))
    tk.seed(module, str(folder))
    assert module.triton_key() == "kept" and module.calls == []
    tk.seed(module, str(folder))  # seeding twice wraps once
    assert module.triton_key.__wrapped__() == "computed"


@pytest.mark.fast
@pytest.mark.parametrize("change", ["rewrite libtriton", "rewrite a compiler file", "add a language file",
                                    "remove a backend file", "another root", "another extension suffix",
                                    "corrupt record", "no record"])
def test_any_change_falls_back_to_tritons_computation(tmp_path, change):
    root, folder = (tmp_path / "triton").resolve(), tmp_path / "keys"
    module = fake_triton(root)
    tk.save_key(str(folder), str(root), "kept", tk.triton_files(str(root)))
    record = Path(tk.record_path(str(folder), str(root)))
    if change == "rewrite libtriton":  # same size, new content, the old mtime: only ctime and content tell
        rewrite(root / "_C" / "libtriton.so", "# _C/libtritoN.so\n")
    elif change == "rewrite a compiler file":  # same size, new content
        (root / "compiler" / "compiler.py").write_text("# compiler/compilez.py\n")
    elif change == "add a language file":
        (root / "language" / "extra.py").write_text("x = 1\n")
    elif change == "remove a backend file":
        (root / "backends" / "nvidia" / "driver.py").unlink()
    elif change == "another root":
        data = json.loads(record.read_text())
        record.write_text(json.dumps({**data, "root": str(tmp_path / "elsewhere")}))
    elif change == "another extension suffix":
        data = json.loads(record.read_text())
        record.write_text(json.dumps({**data, "suffix": ".cpython-311-x86_64-linux-gnu.so"}))
    elif change == "corrupt record":
        record.write_text('{"root": ')
    else:
        record.unlink()
    tk.seed(module, str(folder))
    assert module.triton_key() == "computed" and module.calls == [1]


def rewrite(path: Path, text: str) -> None:
    """New content, the old mtime (as a copy that keeps mtimes would leave it); ctime moves."""
    before = path.stat()
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def restamp(root: Path) -> None:
    """Every file's ctime moves, nothing else: what unpacking an image's layers on another node does."""
    for path in root.rglob("*"):
        if path.is_file():
            st = path.stat()
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.fast
def test_new_ctimes_with_the_same_contents_keep_the_key(tmp_path):
    root, folder = (tmp_path / "triton").resolve(), tmp_path / "keys"
    module = fake_triton(root)
    tk.save_key(str(folder), str(root), "kept", tk.triton_files(str(root)))
    record = Path(tk.record_path(str(folder), str(root)))
    restamp(root)
    assert json.loads(record.read_text())["files"] != tk.triton_files(str(root))
    tk.seed(module, str(folder))
    assert module.triton_key() == "kept" and module.calls == []
    # The record now holds the new stats: the next process takes the stat check.
    assert json.loads(record.read_text())["files"] == tk.triton_files(str(root))


def shared_library(path: Path, body: str) -> Path:
    """A real ELF shared library with a GNU build ID (gcc, ``ld --build-id``)."""
    source = path.with_suffix(".c")
    source.write_text(body)
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--build-id=sha1", "-o", str(path), str(source)], check=True)
    source.unlink()
    return path


@pytest.mark.fast
def test_a_shared_library_is_known_by_size_and_build_id_without_reading_it(tmp_path):
    root, folder = (tmp_path / "triton").resolve(), tmp_path / "keys"
    module = fake_triton(root)
    lib = shared_library(root / "_C" / "libtriton.so", "int triton(void) { return 1; }\n")
    other = shared_library(tmp_path / "other.so", "int triton(void) { return 2; }\n")
    ident = tk.identity(str(lib))
    assert ident.startswith(f"elf:{lib.stat().st_size}:") and len(tk.build_id(str(lib))) == 40
    assert tk.build_id(str(other)) != tk.build_id(str(lib)) and tk.build_id(str(root / "__init__.py")) is None
    tk.save_key(str(folder), str(root), "kept", tk.triton_files(str(root)))
    restamp(root)
    assert tk.kept_key(str(folder), str(root)) == "kept"
    # Another build of the library, put back with the old mtime: its build ID differs, the key is recomputed.
    before = lib.stat()
    lib.write_bytes(other.read_bytes())
    os.utime(lib, ns=(before.st_atime_ns, before.st_mtime_ns))
    tk.seed(module, str(folder))
    assert module.triton_key() == "computed"


def served(python: str, cache: Path, *, read_only: bool = False) -> dict:
    """SERVED in a process that ``kernelcache run`` starts on ``cache``."""
    flags = ["--read-only", "--overlay", str(cache.parent / "overlay")] if read_only else []
    done = kc("run", "--cache-dir", str(cache), *flags, "--", python, "-c", SERVED)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_served_process_takes_the_kept_key_and_never_reads_libtriton(bundle90, tmp_path):
    cache = tmp_path / "c"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    [record] = (cache / ".kernelcache" / "triton-keys").glob("[0-9a-f]*.json")  # beside tool-outputs.json
    variables = json.loads(kc("env", "--cache-dir", str(cache), "--json", check=True).stdout)
    assert variables[tk.ENV_VAR] == str(record.parent)
    assert variables["PYTHONPATH"].split(os.pathsep)[0] == str(SITE)
    assert served(sys.executable, cache) == {"seeded": True, "equal": True, "read_libtriton": False}
    # Without the seed the same process reads libtriton.so: what the audit hook sees is real.
    plain = subprocess.run([sys.executable, "-c", SERVED], env=clean_env(TRITON_CACHE_DIR=str(cache)),
                           capture_output=True, text=True, timeout=300)
    assert json.loads(plain.stdout) == {"seeded": False, "equal": True, "read_libtriton": True}, plain.stderr
    # The read-only overlay serves the base's kept key too.
    assert served(sys.executable, cache, read_only=True) == {"seeded": True, "equal": True, "read_libtriton": False}


def test_a_kept_key_that_lies_is_used_only_while_the_files_hold(bundle90, tmp_path):
    """The record is trusted by stat (or content) alone (that is its point): a changed value with unchanged
    files is taken, and the same record once neither the stats nor the contents hold is not
    (test_fingerprint_cache swaps a real Triton)."""
    cache = tmp_path / "c"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    [record] = (cache / ".kernelcache" / "triton-keys").glob("[0-9a-f]*.json")  # beside tool-outputs.json
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "triton_key": "lie"}))
    assert served(sys.executable, cache)["equal"] is False
    first = next(iter(data["files"]))
    data["files"][first][1] += 1  # the record's view of one file's mtime no longer holds,
    data["content"][first] = "sha256:" + "0" * 64  # nor of its contents
    record.write_text(json.dumps({**data, "triton_key": "lie"}))
    assert served(sys.executable, cache) == {"seeded": True, "equal": True, "read_libtriton": True}


COUNTED_INSTALL = r"""
import json, sys
import triton.runtime.cache as cache
from kernelcache.cli import main
computed, original = [], cache.triton_key
cache.triton_key = lambda: computed.append(1) or original()
try:
    main(["install", sys.argv[1], "--cache-dir", sys.argv[2], "--no-gpu-check"])
except SystemExit as exit:
    assert not exit.code, exit.code
print(json.dumps({"computed": len(computed)}))
"""


def test_an_install_on_restamped_files_takes_the_kept_key(bundle90, tmp_path):
    """An image baked with the install, unpacked on another node: same bytes, new ctimes. The install's
    fingerprint no longer holds by stat and is computed again, but without hashing libtriton.so. (A bundle
    without a Triton identity record, which would vouch for the key by itself: tests/test_fingerprint_identity.py.)
    """
    import triton
    from helpers.bundles import with_identity

    bundle = with_identity(bundle90, tmp_path / "plain.tar.zst", None)
    cache = tmp_path / "c"
    kc("install", str(bundle), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    restamp(Path(triton.__file__).parent)
    counted = subprocess.run([sys.executable, "-c", COUNTED_INSTALL, str(bundle), str(cache)],
                             env=clean_env(), capture_output=True, text=True, timeout=300)
    assert counted.returncode == 0, counted.stderr[-3000:]
    assert json.loads(counted.stdout.strip().splitlines()[-1]) == {"computed": 0}
    # Control: the same install into a dir without a kept key computes it.
    fresh = subprocess.run([sys.executable, "-c", COUNTED_INSTALL, str(bundle), str(tmp_path / "fresh")],
                           env=clean_env(), capture_output=True, text=True, timeout=300)
    assert json.loads(fresh.stdout.strip().splitlines()[-1])["computed"] > 0, fresh.stderr[-3000:]


ACTIVATED = r"""
import json, sys, kernelcache
variables = kernelcache.activate(cache_dir=sys.argv[1])
""" + SERVED


def test_activate_seeds_its_own_process(bundle90, tmp_path):
    cache = tmp_path / "c"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    done = subprocess.run([sys.executable, "-c", ACTIVATED, str(cache)], env=clean_env(), capture_output=True,
                          text=True, timeout=300)
    assert json.loads(done.stdout) == {"seeded": True, "equal": True, "read_libtriton": False}, done.stderr


def test_the_site_dir_goes_before_the_users_entries(bundle90, tmp_path):
    cache = tmp_path / "c"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    mine = os.pathsep.join(["/opt/mine", str(SITE), "/opt/other"])
    variables = json.loads(kc("env", "--cache-dir", str(cache), "--json", env={"PYTHONPATH": mine},
                              check=True).stdout)
    assert variables["PYTHONPATH"].split(os.pathsep) == [str(SITE), "/opt/mine", "/opt/other"]


def test_a_cache_without_kept_keys_changes_nothing(tmp_path):
    cache = tmp_path / "empty"
    cache.mkdir()
    variables = json.loads(kc("env", "--cache-dir", str(cache), "--json", check=True).stdout)
    assert tk.ENV_VAR not in variables and "PYTHONPATH" not in variables
