"""Release artifacts (issue 25): scripts/release.sh builds the sdist and the wheel of the commit reproducibly; the
wheel carries the package with its data and nothing else of the checkout; its metadata says what is tested; and
``kernelcache --version`` answers without loading click."""

from __future__ import annotations

import calendar
import email.parser
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest
from helpers.common import ROOT, clean_env, entry_point
from helpers.wheel import release, uv_env

import kernelcache


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Two release builds of HEAD, one after the other, into two directories."""
    top = tmp_path_factory.mktemp("release")
    return release(top / "first", tree="head"), release(top / "second", tree="head")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_two_builds_of_one_commit_are_the_same_bytes(artifacts):
    first, second = artifacts
    assert [p.name for p in first] == [p.name for p in second]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_every_time_stamp_is_the_commits(artifacts):
    (sdist, wheel), _ = artifacts
    committed = int(git("log", "-1", "--format=%ct", "HEAD"))
    with zipfile.ZipFile(wheel) as archive:  # zip keeps even seconds, in the local time of no zone
        assert {committed - calendar.timegm(i.date_time + (0, 0, 0)) for i in archive.infolist()} <= {0, 1}
    with tarfile.open(sdist) as archive:
        assert {m.mtime for m in archive.getmembers()} == {committed}


def test_the_wheel_holds_the_committed_package_and_its_data_only(artifacts):
    (sdist, wheel), _ = artifacts
    committed = set(git("ls-tree", "-r", "--name-only", "HEAD", "kernelcache").split())
    assert {"kernelcache/recipes/vllm-sampler.toml", "kernelcache/recipes/models/qwen3-30b-a3b.toml",
            "kernelcache/hooks/kernelcache_prebuilt.py"} <= committed
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    info = f"kernelcache-{kernelcache.__version__}.dist-info/"
    script = f"kernelcache-{kernelcache.__version__}.data/scripts/kernelcache"
    assert {n for n in names if not n.startswith(info)} == committed | {script}
    with tarfile.open(sdist) as archive:
        top = {m.name.split("/", 2)[1] for m in archive.getmembers() if m.name.count("/")}
    assert {"kernelcache", "tests", "docs", "examples", "scripts", "CHANGELOG.md", "LICENSE", "pyproject.toml",
            "README.md", "PKG-INFO"} <= top and ".ci" not in top


def test_the_metadata_states_license_python_and_version(artifacts):
    (_, wheel), _ = artifacts
    with zipfile.ZipFile(wheel) as archive:
        info = f"kernelcache-{kernelcache.__version__}.dist-info/"
        metadata = email.parser.Parser().parsestr(archive.read(info + "METADATA").decode())
        listed = archive.namelist()
    assert metadata["Version"] == kernelcache.__version__
    assert metadata["License-Expression"] == "Apache-2.0" and metadata["Requires-Python"] == ">=3.12"
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3.12" in classifiers
    assert not [c for c in classifiers if re.search(r"Python :: 3\.(?!12)\d+", c)]  # only what CI runs
    required = sorted(r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r)
    assert required == ["click>=8.1", "filelock>=3.12", "rich>=13", "zstandard>=0.22"]  # torch, Triton: the image's
    assert info + "entry_points.txt" not in listed  # the command is the wheel's own script (bin/kernelcache)
    assert f"## {kernelcache.__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_the_command_is_a_plain_script_that_imports_only_kernelcache(artifacts, tmp_path):
    """The wheel ships ``kernelcache`` as a script (installers point its ``#!python`` at their venv), not as an entry
    point whose pip launcher imports ``re`` first: the command imports nothing a Python start does not, but
    kernelcache's own modules."""
    (_, wheel), _ = artifacts
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(f"kernelcache-{kernelcache.__version__}.data/scripts/kernelcache").decode()
    assert text.startswith("#!python\n")
    script = tmp_path / "kernelcache"
    script.write_text(text)
    env = clean_env(PYTHONPATH=str(ROOT))

    def imported(*argv: str) -> set[str]:
        done = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, capture_output=True, text=True,
                              check=True, cwd=tmp_path)
        return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}

    extra = imported(str(script), "--version") - imported("-c", "pass")
    assert "kernelcache.entry" in extra
    assert {m for m in extra if m != "__future__" and not m.startswith("kernelcache")} == set()


def test_version_is_answered_without_click_and_says_what_click_says():
    seen, done = entry_point("--version", watched=("click", "rich", "kernelcache.cli"))
    assert seen == {"exit": 0, "imported": []}
    code = "import sys; from kernelcache.cli import main; main(['--version'], prog_name='kernelcache')"
    clicked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout == clicked.stdout == f"kernelcache, version {kernelcache.__version__}\n"


@pytest.mark.slow  # pip fetches uv from PyPI into the clone's build/uv
def test_release_works_on_a_fresh_clone_as_the_readme_says(tmp_path):
    """No uv at build/uv, no PYTHON=: release.sh gets uv itself and finds Python 3.12 as setup.sh does (pyenv's shim
    for 3.12 fails to run unless 3.12 is selected; the script takes pyenv's interpreter by path)."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in uv_env().items() if k not in ("PYTHON", "UV")}
    done = subprocess.run(["bash", "scripts/release.sh", str(tmp_path / "dist")], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (clone / "build" / "uv" / "bin" / "uv").is_file()
    assert [p.name for p in sorted((tmp_path / "dist").iterdir())] == [
        f"kernelcache-{kernelcache.__version__}-py3-none-any.whl", f"kernelcache-{kernelcache.__version__}.tar.gz"]
