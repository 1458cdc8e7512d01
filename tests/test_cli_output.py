"""What the commands print where users read it: a pipe, a log, an 80-column terminal.

Tables print one plain row per item, every cell whole, when stdout is not a terminal or is narrower than the rows
(as ``pip list`` and ``docker images`` do); a reader that stops reading (``| head -1``) ends the command quietly,
with exit 0; a key file that is not one is named with the whole reason the key parser gave.
"""

from __future__ import annotations

import subprocess
import sys

from helpers.common import clean_env, kc

BOX = ("┃", "│", "━")


def installed_cache(bundle, where):
    kc("install", str(bundle), "--cache-dir", str(where), env={"KERNELCACHE_NO_GPU_PROBE": "1"}, check=True)
    return where


def test_ls_piped_or_narrow_prints_one_plain_row_per_bundle_with_its_name_whole(small_bundle, tmp_path):
    cache = installed_cache(small_bundle, tmp_path / "c")
    for env in ({}, {"FORCE_COLOR": "1", "COLUMNS": "80"}):  # a pipe; a terminal of 80 columns
        text = kc("ls", "--cache-dir", str(cache), env=env, check=True).stdout
        assert not any(mark in text for mark in BOX), text
        [row] = [line for line in text.splitlines() if line.startswith("small-sm_90 ")]
        assert row.split()[1:3] == [_digest(cache)[:12], "sm_90"] and "unsigned" in row
        header = text.splitlines()[1]
        assert header.split()[:3] == ["name", "digest", "target"]
    wide = kc("ls", "--cache-dir", str(cache), env={"FORCE_COLOR": "1", "COLUMNS": "400"}, check=True).stdout
    assert "┃" in wide and "small-sm_90" in wide  # a terminal wide enough keeps the table


def _digest(cache) -> str:
    [receipt] = (cache / ".kernelcache" / "installed").glob("*.json")
    return receipt.stem


def test_every_table_is_plain_rows_in_a_pipe(small_bundle):
    inspected = kc("inspect", str(small_bundle), check=True).stdout
    gpus = kc("gpus", check=True).stdout
    recipes = kc("recipes", check=True).stdout
    for text in (inspected, gpus, recipes):
        assert not any(mark in text for mark in BOX), text
    assert any(line.split()[:2] == ["h100-pcie", "sm_90"] for line in gpus.splitlines())
    assert any(line.startswith("vllm-sampler ") for line in recipes.splitlines())
    assert any(line.split()[0] == "kernel" and line.split()[1] == "variants" for line in inspected.splitlines())


def test_a_closed_pipe_exits_0_and_says_nothing(small_bundle):
    for args in (["inspect", str(small_bundle)], ["gpus"], ["inspect", str(small_bundle), "--json"]):
        command = " ".join([sys.executable, "-m", "kernelcache", *args]) + ' | head -1; exit "${PIPESTATUS[0]}"'
        done = subprocess.run(["bash", "-c", command], env=clean_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stderr == "", (args, done.returncode, done.stderr)
        assert len(done.stdout.splitlines()) == 1


def test_a_key_file_that_is_not_a_key_is_named_with_the_whole_reason(tmp_path, small_bundle):
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = tmp_path / "afile"
    key.write_text("a plain file")
    try:
        load_pem_private_key(key.read_bytes(), None)
    except ValueError as exc:
        reason = " ".join(str(exc).split())
    done = kc("sign", str(small_bundle), "--key", str(key))
    [line] = done.stderr.strip().splitlines()
    assert done.returncode == 4 and line.endswith(f"is not a PEM private key ({reason})"), line
