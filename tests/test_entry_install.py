"""A cold ``kernelcache install`` through the entry point's plain form (no click) says and does what the click
command says and does: the same output, warnings, errors, tables and exit codes, and the same cache dir."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bundles import rewrite
from helpers.common import ROOT, clean_env, tree
from helpers.hostile import bundle as hostile_bundle
from helpers.hostile import load_base, regular

from kernelcache.errors import FingerprintMismatch, IntegrityError, UsageError

CLICK = "import sys; from kernelcache.cli import main; main(prog_name='kernelcache')"


def run(how: str, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """``kernelcache ARGS`` through the entry point (as the console script runs it) or the click CLI itself."""
    argv = [sys.executable, *(["-m", "kernelcache"] if how == "entry" else ["-c", CLICK]), *args]
    return subprocess.run(argv, env=clean_env(KERNELCACHE_NO_GPU_PROBE="1", **(env or {})), capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


def both(tmp_path: Path, bundle: Path, *flags: str, env: dict | None = None, cache: str = "c") -> dict:
    """The same install into two fresh cache dirs, one per way in; paths and timings made comparable."""
    done = {}
    for how in ("entry", "click"):
        target = tmp_path / how / cache
        (tmp_path / how).mkdir(exist_ok=True)
        result = run(how, ["install", str(bundle), "--cache-dir", str(target), *flags], env)
        scrub = [(str(tmp_path / how), "<tmp>"), (str(tmp_path), "<tmp>")]
        out, err = result.stdout, result.stderr
        for before, after in scrub:
            out, err = out.replace(before, after), err.replace(before, after)
        out = re.sub(r" in \d+\.\d\ds$", " in <s>s", out, flags=re.M)
        out = re.sub(r'"seconds": [0-9.e-]+', '"seconds": 0', out)
        files = tree(target) if target.is_dir() else None
        if files is not None:
            files = {k: v[0] for k, v in files.items() if "/.kernelcache/" not in f"/{k}"}
        done[how] = (result.returncode, out, err, files)
    return done


@pytest.fixture(scope="module")
def variants(small_bundle, tmp_path_factory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("variants")
    base = load_base(small_bundle, where / "escape")
    name, data = base.member(".cubin")
    damaged = where / "damaged.tar.zst"
    damaged.write_bytes(hostile_bundle(base, None, [regular(n, bytes([d[0] ^ 1]) + d[1:] if n == name else d)
                                                    for n, d in base.members]))
    return {
        "good": small_bundle,
        "other-python": rewrite(small_bundle, where / "py.tar.zst", python="cp399", triton_key_sha256="f" * 64),
        "other-torch": rewrite(small_bundle, where / "torch.tar.zst", torch="2.11.0+cu130"),
        "damaged": damaged,
    }


@pytest.mark.parametrize("flags", [(), ("--json",)])
def test_an_install_says_the_same(variants, tmp_path, flags):
    done = both(tmp_path, variants["good"], *flags)
    assert done["entry"] == done["click"]
    assert done["entry"][0] == 0 and done["entry"][3]
    if flags:
        assert json.loads(done["entry"][1])["action"] == "installed"
    else:
        assert done["entry"][1].startswith("installed ")


@pytest.mark.parametrize("variant, flags, env, code, says", [
    ("other-torch", (), {}, 0, "warning: torch: bundle 2.11.0+cu130"),
    ("other-python", (), {}, FingerprintMismatch.exit_code, "fingerprint differences"),
    ("good", (), {"TRITON_DEFAULT_FP_FUSION": "1"}, FingerprintMismatch.exit_code, "TRITON_DEFAULT_FP_FUSION"),
    ("damaged", (), {}, IntegrityError.exit_code, "does not match its sha256"),
    ("good", (), {"KERNELCACHE_MAX_TOTAL_BYTES": "lots"}, UsageError.exit_code, "KERNELCACHE_MAX_TOTAL_BYTES"),
    ("good", (), {"KERNELCACHE_MAX_TOTAL_BYTES": "1K"}, 15, "over the 1024 byte limit"),
])
def test_warnings_refusals_and_errors_are_the_same(variants, tmp_path, variant, flags, env, code, says):
    done = both(tmp_path, variants[variant], *flags, env=env)
    assert done["entry"] == done["click"]
    returncode, _, stderr, files = done["entry"]
    assert returncode == code and says in stderr, stderr
    if code:
        assert stderr.strip().splitlines()[-1].startswith("kernelcache: error:")
        assert not files  # refused before anything was published


def test_a_missing_bundle_and_a_file_as_cache_dir_are_the_same(variants, tmp_path):
    done = both(tmp_path, tmp_path / "nothing.tar.zst")
    assert done["entry"] == done["click"] and done["entry"][0] == UsageError.exit_code
    for how in ("entry", "click"):
        (tmp_path / how / "file").write_text("x")
    done = both(tmp_path, variants["good"], cache="file")
    assert done["entry"] == done["click"] and done["entry"][0] == 2 and "is a file" in done["entry"][2]


def test_a_cold_install_loads_neither_click_nor_filelock(variants, tmp_path):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "kernelcache", "install", str(variants["good"]),
                           "--cache-dir", str(tmp_path / "c")], env=clean_env(KERNELCACHE_NO_GPU_PROBE="1"),
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0 and done.stdout.startswith("installed "), done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "kernelcache.install" in imported
    assert not imported & {"click", "filelock", "rich", "kernelcache.cli"}
