"""The serving stack end to end: what a user of `pip install vllm==0.33.0` (Python 3.12) gets.

Two separate serving-stack venvs, both made by scripts/setup.sh with STACK=serving (vLLM 0.33.0's own
dependency set: torch 2.14.0, triton 3.8.0, flashinfer-python 0.7.2.post1):
  KERNELCACHE_SERVING_VENV   builds (like the Dockerfile's build stage and the workflow's job)
  KERNELCACHE_SERVING_VENV2  a plain `pip install vllm==0.33.0` + kernelcache, where bundles are installed
This test process runs on the lab stack (triton 3.6.0): its bundles must be refused in the serving venv.
Without the two venvs these tests skip, except under CI=true or KERNELCACHE_REQUIRE_SERVING=1, where
that is a failure (scripts/test.sh sets them up).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import clean_env, kc
from test_examples import DOCKERFILE, WORKFLOW, dockerfile_instructions, shell_commands, stages

from kernelcache.bundle.fingerprint import package_version

pytestmark = [pytest.mark.serving, pytest.mark.slow]
ARCH, GPU, VOCAB = "sm_90", "h200", "128256"


@dataclass(frozen=True)
class Venv:
    root: Path

    def kernelcache(self, *args: str, cwd: Path | None = None, env: dict | None = None,
                    timeout: int = 1800) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.root / "bin" / "kernelcache"), *args], cwd=cwd, env=clean_env(**(env or {})),
                              capture_output=True, text=True, timeout=timeout)

    def version(self, package: str) -> str:
        code = f"import importlib.metadata as m; print(m.version({package!r}))"
        return subprocess.run([str(self.root / "bin" / "python"), "-c", code], capture_output=True, text=True,
                              check=True).stdout.strip()


def serving_venv(variable: str) -> Venv:
    value = os.environ.get(variable)
    if not value or not (Path(value) / "bin" / "kernelcache").is_file():
        message = f"{variable} does not name a serving-stack venv with kernelcache (STACK=serving scripts/setup.sh)"
        if os.environ.get("CI") == "true" or os.environ.get("KERNELCACHE_REQUIRE_SERVING") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return Venv(Path(value))


@pytest.fixture(scope="module")
def builder() -> Venv:
    return serving_venv("KERNELCACHE_SERVING_VENV")


@pytest.fixture(scope="module")
def server() -> Venv:
    venv = serving_venv("KERNELCACHE_SERVING_VENV2")
    assert venv.root != serving_venv("KERNELCACHE_SERVING_VENV").root, "the install side must be its own venv"
    return venv


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def server_fingerprint(server, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fingerprint") / "serving.json"
    path.write_text(ok(server.kernelcache("fingerprint", "--json")).stdout)
    return path


def test_both_venvs_are_vllm_0_33s_own_stack(builder, server):
    for venv in (builder, server):
        assert [venv.version(p) for p in ("vllm", "torch", "triton", "flashinfer-python")] == \
            ["0.33.0", "2.14.0", "3.8.0", "0.7.2.post1"]
        assert subprocess.run([str(venv.root / "bin" / "python"), "-c", "import sys; print(sys.version_info[:2])"],
                              capture_output=True, text=True).stdout.strip() == "(3, 12)"


# -- one vocab, every path: build (toolchain fetched by the build), install elsewhere, verify -----------


@pytest.fixture(scope="module")
def one_vocab(builder, server_fingerprint, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The default manifest's paths for one vocab, built in the builder venv with no CUDA toolchain yet."""
    work = tmp_path_factory.mktemp("serving-build")
    done = ok(builder.kernelcache("build", "--arch", ARCH, "--gpu", GPU, "--vocab", VOCAB, "--target-env",
                                  str(server_fingerprint), "-o", str(work / "out"), "--json",
                                  env={"KERNELCACHE_TOOLCHAIN_DIR": str(work / "toolchains")}, timeout=3000))
    return work / "out" / f"vllm-sampler-{ARCH}-{GPU}.tar.zst", done


def test_build_fetches_its_toolchain_and_covers_every_path(one_vocab):
    bundle, done = one_vocab
    assert "fetching the CUDA 13.0.88 build toolchain" in done.stderr and "toolchain ready" in done.stderr
    [target] = json.loads(done.stdout)
    [record] = target["bundles"]
    assert record["path"] == str(bundle) and record["kernels"] > 0
    assert record["flashinfer"] == [{"name": "sampling", "archs": ["sm90a"]}]
    paths = {p for cov in target["coverage"].values() for p in cov["by_path"]}
    assert {"registry", "mrv1", "mrv2"} <= paths


def test_bundle_installs_and_verifies_in_another_serving_venv(one_vocab, server, tmp_path):
    bundle, _ = one_vocab
    cache = tmp_path / "cache"
    installed = ok(server.kernelcache("install", str(bundle), "--cache-dir", str(cache)))
    assert re.search(r"installed \d+ entries", installed.stdout)
    verified = ok(server.kernelcache("verify", str(bundle), "--cache-dir", str(cache), timeout=3000))
    assert re.search(r"\b[1-9]\d* hits, 0 compiles,", verified.stdout), verified.stdout


# -- refusals: a lab bundle at install, and a lab build for the serving image at build time -------------


def test_lab_bundle_is_refused_in_the_serving_venv(bundle90, server, tmp_path):
    """bundle90: real kernels compiled on this (lab) stack, triton 3.6.0."""
    done = server.kernelcache("install", str(bundle90), "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 20, (done.stdout, done.stderr)
    table = done.stderr.split("fingerprint differences", 1)[1]
    assert re.search(rf"triton\s.*{re.escape(package_version('triton'))}.*3\.8\.0", table), table
    assert "triton_key_sha256" in table
    if sys.version_info[:2] != (3, 12):
        assert "python" in table
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_lab_build_for_the_serving_fingerprint_is_refused_before_compiling(server_fingerprint, tmp_path):
    done = kc("build", "--arch", ARCH, "--gpu", GPU, "--vocab", VOCAB, "--target-env", str(server_fingerprint),
              "-o", str(tmp_path / "out"), "--workdir", str(tmp_path / "work"))
    assert done.returncode == 20, (done.stdout, done.stderr)
    table = done.stderr.split("fingerprint differences", 1)[1]
    assert "triton" in table and "3.8.0" in table
    assert not (tmp_path / "work").exists() and not list((tmp_path / "out").glob("*.tar.zst"))


# -- the examples, run: the Dockerfile's build and runtime stages, the workflow's build step ------------


def dockerfile_args() -> dict[str, str]:
    """The ARG defaults declared before the first FROM (ARCH, GPU, ...)."""
    args = {}
    for keyword, rest in dockerfile_instructions(DOCKERFILE):
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value
    return args


def stage_commands(stage: str, args: dict[str, str], paths: dict[str, Path]) -> list[list[str]]:
    """The stage's RUN commands with its ARGs filled in and absolute container paths mapped to ``paths``."""
    commands = []
    for keyword, rest in stages()[stage]:
        if keyword != "RUN":
            continue
        text = re.sub(r"^(--\S+\s+)+", "", rest)
        text = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)
        for container_path, local in paths.items():
            text = text.replace(container_path, str(local))
        commands += shell_commands(text)
    return commands


def workflow_build_commands(matrix: dict[str, str]) -> list[list[str]]:
    job = yaml.safe_load(WORKFLOW.read_text())["jobs"]["bundle"]
    [step] = [s for s in job["steps"] if s.get("name") == "Build the bundle"]
    text = re.sub(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", lambda m: matrix[m.group(1)], step["run"])
    return shell_commands(text)


def run_example(venv: Venv, command: list[str], cwd: Path) -> subprocess.CompletedProcess | None:
    """A kernelcache command runs in ``venv``; pip-installing kernelcache is what the venv already did."""
    if command[:2] == ["pip", "install"]:
        assert any(w.startswith(("kernelcache==", "kernelcache[")) for w in command), command
        return None  # this checkout is installed in the venv; the release on PyPI is not this code
    assert command[0] == "kernelcache", command
    return ok(venv.kernelcache(*command[1:], cwd=cwd, timeout=3000))


def test_dockerfile_and_workflow_build_commands_run_on_the_serving_stack(builder, server, tmp_path):
    """The workflow's build step (its first matrix entry) and the Dockerfile's build stage give the same
    `kernelcache build` command; it runs once, for real, with the default manifest. Then the Dockerfile's
    `inspect` and the runtime stage's `install` run, the install in the second serving venv."""
    matrix = yaml.safe_load(WORKFLOW.read_text())["jobs"]["bundle"]["strategy"]["matrix"]["include"][0]
    args = dockerfile_args()
    assert (matrix["arch"], matrix["gpu"]) == (args["ARCH"], args["GPU"])
    paths = {"/bundles": tmp_path / "bundles", "/opt/kernelcache/cache": tmp_path / "cache"}
    workflow = workflow_build_commands(matrix)
    build_stage = stage_commands("build", args, paths)
    builds = [c for c in workflow + build_stage if c[:2] == ["kernelcache", "build"]]
    assert len(builds) == 2 and strip_output(builds[0]) == strip_output(builds[1]), builds

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    for command in workflow:
        run_example(builder, command, cwd=job_dir)
    bundle = job_dir / "bundles" / f"vllm-sampler-{args['ARCH']}-{args['GPU']}.tar.zst"
    assert bundle.is_file()
    shutil.copytree(job_dir / "bundles", paths["/bundles"])  # the build stage's identical build
    for command in build_stage:
        if command[:2] != ["kernelcache", "build"]:
            run_example(builder, command, cwd=tmp_path)
    for command in stage_commands("runtime", args, paths):
        done = run_example(server, command, cwd=tmp_path)
        if done is not None and command[1] == "install":
            assert re.search(r"installed \d+ entries", done.stdout), done.stdout
    assert any(paths["/opt/kernelcache/cache"].iterdir())


def strip_output(command: list[str]) -> list[str]:
    """A build command without its -o DIR."""
    words = list(command)
    for flag in ("-o", "--output-dir"):
        if flag in words:
            i = words.index(flag)
            del words[i:i + 2]
    return words
