"""One pod-start command asks once whether a bundle file was checked here before (cachedir/checked.py
``find_checked``): the front door that asks first (entry.py, runtime/env.py) hands its answer to the installer, and
the installer asks only when nobody did. Each command runs in a fresh process, as its console script runs it, with
``find_checked`` counted wherever it is looked up and the final exec replaced by a line that says what it would run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.common import clean_env

COUNTED = r"""
import json, sys
import kernelcache.cachedir.checked as checked
import kernelcache.runtime.shell as shell
asked = []
original = checked.find_checked

def counted(*args, **kwargs):
    found = original(*args, **kwargs)
    asked.append(found is not None)
    return found

checked.find_checked = counted
import kernelcache.install as installer
installer.find_checked = counted

def done():
    print(json.dumps(asked), file=sys.stderr)

def exec_command(command, variables):
    done()
    raise SystemExit(0)

shell.exec_command = exec_command
from kernelcache.entry import main
sys.argv = ["kernelcache", *sys.argv[1:]]
try:
    main()
finally:
    if sys.argv[1] == "install":
        done()
"""


def asked(*args: str) -> list[bool]:
    """What each ``find_checked`` call of ``kernelcache ARGS`` answered (True: the no-op answer)."""
    done = subprocess.run([sys.executable, "-c", COUNTED, *args], env=clean_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.fixture
def bundle(small_bundle, tmp_path) -> Path:
    shutil.copy(small_bundle, tmp_path / "b.tar.zst")
    return tmp_path / "b.tar.zst"


def test_install_asks_once_then_answers_from_the_record(bundle, tmp_path):
    cache = str(tmp_path / "c")
    assert asked("install", str(bundle), "--cache-dir", cache) == [False]
    assert asked("install", str(bundle), "--cache-dir", cache) == [True]


def test_run_with_the_bundle_asks_once_whether_it_installs_or_is_answered(bundle, tmp_path):
    cache = str(tmp_path / "c")
    assert asked("run", "--bundle", str(bundle), "--cache-dir", cache, "--", "true") == [False]
    assert asked("run", "--bundle", str(bundle), "--cache-dir", cache, "--", "true") == [True]
    (bundle.parent / "c" / ".kernelcache" / "checked").rename(tmp_path / "records")  # the record is gone
    assert asked("run", "--bundle", str(bundle), "--cache-dir", cache, "--", "true") == [False]
