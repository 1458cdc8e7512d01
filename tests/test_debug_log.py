"""With ``KERNELCACHE_DEBUG`` set, a served process says on stderr, one line each, which kept record it used or
refused and why; without it, it says nothing and imports nothing more (kernelcache_tritonkey.say).

The served processes are real: ``kernelcache run`` on an installed bundle, Triton's own modules asking for
``triton_key()``, ``ptxas --version``, ``ldconfig -p`` and a build of ``cuda_utils`` (with ``CC=/bin/false``: a
module not taken from the cache fails to build instead of taking minutes).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers.common import entry_point, kc

from kernelcache.cachedir.flashinfer_site import Provider, site_files
from kernelcache.hooks import kernelcache_outputs, kernelcache_tritonkey

PROBE = r"""
import os, shutil, sys, tempfile
import triton.runtime.cache as cache
cache.triton_key()
from triton import knobs
from triton.backends.nvidia import compiler, driver
knobs.nvidia.ptxas.version
compiler.get_ptxas_version(90)
try:
    driver.libcuda_dirs()
except AssertionError:  # no GPU driver here: Triton's own message, after reading ldconfig -p
    pass
from triton.runtime import build
source = os.path.join(os.path.dirname(driver.__file__), "driver.c")
if sys.argv[1] == "other-source":  # one byte more: no module in the cache was built from it
    source = shutil.copy(source, tempfile.mkdtemp())
    open(source, "a").write("\n")
try:
    build._build("cuda_utils", source, tempfile.mkdtemp(), [], [], [], [])
except Exception as exc:
    print(f"build failed: {type(exc).__name__}", file=sys.stderr)
"""


@pytest.fixture
def cache(bundle90, tmp_path) -> Path:
    cache = tmp_path / "c"
    kc("install", str(bundle90), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    return cache


def served(cache: Path, case: str = "kept", **env: str) -> list[str]:
    """The debug lines of a served PROBE process."""
    done = kc("run", "--cache-dir", str(cache), "--", sys.executable, "-c", PROBE, case,
              env={"CC": "/bin/false", **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return [line.split(": ", 1)[1] for line in done.stderr.splitlines() if line.startswith("kernelcache[")]


def said(lines: list[str], subject: str) -> list[str]:
    return [line.removeprefix(subject + ": ") for line in lines if line.startswith(subject + ": ")]


def test_a_served_process_says_each_kept_record_it_used(cache):
    keys = cache / ".kernelcache" / "triton-keys"
    first = served(cache, KERNELCACHE_DEBUG="1")
    assert said(first, "kept served variables")[0].startswith("refused, computed again (no readable record")
    [record] = (cache / ".kernelcache" / "served").glob("*.json")
    assert said(first, "served variables") == [f"kept for the next start ({record})"]
    lines = served(cache, KERNELCACHE_DEBUG="1")
    assert said(lines, "kept served variables")[0].startswith("used (every stamp in ")
    assert said(lines, "served process") == [f"TRITON_CACHE_DIR={cache} (kept records from {keys})"]
    [key] = said(lines, "triton_key()")
    assert key.startswith("kept value used (every file's stat as recorded in ")
    ptxas = [line for line in lines if "ptxas --version`: " in line]
    assert len(ptxas) == 2 and all("kept output used" in line for line in ptxas)  # as Triton asks it: twice
    assert said(lines, "`/sbin/ldconfig -p`") == [f"kept output used (recorded in {keys / kernelcache_outputs.RECORD})"]
    [helper] = said(lines, "helper module cuda_utils")
    assert helper.startswith(f"taken from the cache instead of a gcc build ({cache}/")


def test_a_refused_record_says_why(cache):
    keys = cache / ".kernelcache" / "triton-keys"
    [record] = keys.glob("[0-9a-f]*.json")
    data = json.loads(record.read_text())
    first = sorted(data["files"])[0]
    data["files"][first][1] += 1  # neither the stat nor the contents hold for this file
    data["content"][first] = "sha256:" + "0" * 64
    record.write_text(json.dumps(data))
    outputs = json.loads((keys / kernelcache_outputs.RECORD).read_text())
    for entry in outputs["outputs"]:
        for stat in entry["files"].values():
            if stat is not None:  # (a magic file file's entry names as absent)
                stat[2] += 1  # as an upgrade in place moves the ctimes
    (keys / kernelcache_outputs.RECORD).write_text(json.dumps(outputs))
    lines = served(cache, "other-source", KERNELCACHE_DEBUG="1")
    assert said(lines, "triton_key()") == [f"refused the kept value, Triton computes it (contents changed: {first})"]
    ldconfig = said(lines, "`/sbin/ldconfig -p`")[0]
    assert ldconfig.startswith("refused the kept output, the command runs (") and "is not the recorded file" in ldconfig
    assert said(lines, "helper module cuda_utils") == [
        f"not taken from the cache, Triton builds it (no module built from this source in {cache})"]


@pytest.mark.parametrize("value", [None, "0"])
def test_without_the_variable_nothing_is_said(cache, value):
    env = {} if value is None else {kernelcache_tritonkey.DEBUG_ENV: value}
    done = kc("run", "--cache-dir", str(cache), "--", sys.executable, "-c", PROBE, "kept",
              env={"CC": "/bin/false", **env})
    assert done.returncode == 0 and "kernelcache[" not in done.stderr, done.stderr[-3000:]


def test_the_pod_start_path_imports_the_log_only_when_asked(cache):
    watched = ("kernelcache.hooks.kernelcache_tritonkey",)
    entry_point("env", "--cache-dir", str(cache), "--json", watched=watched)  # the record: the next is the fast path
    quiet, done = entry_point("env", "--cache-dir", str(cache), "--json", watched=watched)
    assert quiet == {"exit": 0, "imported": []} and "kernelcache[" not in done.stderr
    loud, done = entry_point("env", "--cache-dir", str(cache), "--json", watched=watched, KERNELCACHE_DEBUG="1")
    assert loud == {"exit": 0, "imported": list(watched)}  # the watch is real
    assert said([line.split(": ", 1)[1] for line in done.stderr.splitlines() if line.startswith("kernelcache[")],
                "kept served variables")[0].startswith("used")
    assert json.loads(done.stdout)["TRITON_CACHE_DIR"] == str(cache)  # stdout stays the variables alone


def test_the_flashinfer_provider_says_when_flashinfer_asks_for_it(tmp_path, capsys, monkeypatch):
    provider = Provider("kernelcache-x", tmp_path / "flashinfer" / "x", "0.7.2", ("sm_90",), ("sampling",))
    [source] = [text for name, text in site_files([provider]).items() if name.startswith("providers/")
                and name.endswith(".py")]
    module: dict = {}
    exec(compile(source, "provider.py", "exec"), module)  # the generated module, as FlashInfer's entry point loads it
    monkeypatch.delenv(kernelcache_tritonkey.DEBUG_ENV, raising=False)
    assert module["provider_0"]()["jit_cache_dir"] == str(provider.jit_cache_dir)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(kernelcache_tritonkey.DEBUG_ENV, "1")
    module["provider_0"]()
    assert capsys.readouterr().err == (f"kernelcache[{os.getpid()}]: FlashInfer provider: handed to FlashInfer "
                                       f"(sampling for flashinfer 0.7.2 from {provider.jit_cache_dir})\n")
