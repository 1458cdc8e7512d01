"""The deployment recipes in examples/ are checked, since docker and a cluster cannot run here.

Every ``kernelcache`` command line in them must name a real subcommand with real options (read from
the click command tree, not from a list kept here); the Kubernetes manifests must pass the
Kubernetes schema and agree with themselves (mounts, shared volumes, cache dirs); the Dockerfile
must pass hadolint and build and serve from one base image; the workflow must pass the GitHub
Actions schema and build one bundle per arch/GPU that exists.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from kernelcache.cli import main
from kernelcache.plan.gpus import profile
from kernelcache.remote import oci

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DOCKERFILE = EXAMPLES / "Dockerfile"
DEPLOYMENT = EXAMPLES / "kubernetes" / "deployment.yaml"
READONLY = EXAMPLES / "kubernetes" / "deployment-readonly.yaml"
WORKFLOW = EXAMPLES / "ci" / "github-actions.yml"
# Commands other developers are adding right now. Checked strictly once they exist in cli/.
# -- finding kernelcache invocations -------------------------------------------------------------


def shell_commands(text: str) -> list[list[str]]:
    """Simple commands of a shell script, split at && || ; |, with ${{ }} and ${VAR} made plain words."""
    text = re.sub(r"\$\{\{[^}]*\}\}", "X", text.replace("\\\n", " "))
    text = re.sub(r"\$\{?(\w+)\}?", r"\1", text)
    commands = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in words + [";"]:
            if word in ("&&", "||", ";", "|"):
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    lines, current = [], ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#") and not current:
            continue
        current += raw.rstrip("\\").strip() + " " if raw.endswith("\\") else raw.strip()
        if not raw.endswith("\\"):
            if current.strip():
                keyword, _, rest = current.strip().partition(" ")
                lines.append((keyword.upper(), rest.strip()))
            current = ""
    return lines


def dockerfile_commands() -> list[list[str]]:
    found = []
    for keyword, rest in dockerfile_instructions(DOCKERFILE):
        if keyword == "RUN":
            found += shell_commands(re.sub(r"^(--\S+\s+)+", "", rest))
        elif keyword in ("ENTRYPOINT", "CMD"):
            found.append(yaml.safe_load(rest))
    return found


def containers(document: dict) -> list[dict]:
    spec = document["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def kubernetes_commands(path: Path) -> list[list[str]]:
    return [c.get("command", []) + c.get("args", []) for d in yaml.safe_load_all(path.read_text())
            for c in containers(d)]


def workflow_commands() -> list[list[str]]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    return [cmd for job in workflow["jobs"].values() for step in job["steps"] if "run" in step
            for cmd in shell_commands(step["run"])]


def invocations() -> list[tuple[str, list[str]]]:
    sources = {"Dockerfile": dockerfile_commands(), "deployment.yaml": kubernetes_commands(DEPLOYMENT),
               "deployment-readonly.yaml": kubernetes_commands(READONLY), "github-actions.yml": workflow_commands()}
    return [(name, cmd[1:]) for name, cmds in sources.items() for cmd in cmds if cmd and cmd[0] == "kernelcache"]


# -- checking them against the click command tree ------------------------------------------------


def check_invocation(args: list[str]) -> tuple[str, str]:
    """("ok" | "error", why)."""
    name, rest = args[0], args[1:]
    command = main.commands.get(name)
    if command is None:
        return "error", f"no command {name!r}"
    options = {opt: p for p in command.params if isinstance(p, click.Option) for opt in p.opts + p.secondary_opts}
    positional, words = 0, iter(rest)
    for word in words:
        if word == "--":
            positional += len(list(words))  # the user's command: COMMAND... of `run`
            break
        if word.startswith("-"):
            option = options.get(word.split("=", 1)[0])
            if option is None:
                return "error", f"{name} has no option {word}"
            if not option.is_flag and "=" not in word:
                next(words, None)
        else:
            positional += 1
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    required = sum(1 for p in arguments if p.required)
    variadic = any(p.nargs == -1 for p in arguments)
    if positional < required or (not variadic and positional > len(arguments)):
        return "error", f"{name} takes {len(arguments)} argument(s), got {positional}: {rest}"
    return "ok", ""


def test_every_example_command_exists_with_its_options():
    found = invocations()
    assert {name for name, _ in found} == {"Dockerfile", "deployment.yaml", "deployment-readonly.yaml",
                                          "github-actions.yml"}
    errors = [(name, args, why) for name, args in found for status, why in [check_invocation(args)]
              if status == "error"]
    assert not errors
    used = {args[0] for _, args in found}
    assert {"install", "run", "push", "inspect"} <= used




def test_the_checker_catches_wrong_commands():
    assert check_invocation(["install", "b.tar.zst", "--cache-dir", "/c"])[0] == "ok"
    assert check_invocation(["install", "b.tar.zst", "--cache-directory", "/c"])[0] == "error"
    assert check_invocation(["install"])[0] == "error"
    assert check_invocation(["instal", "x"])[0] == "error"
    assert check_invocation(["push", "a", "b", "oci://h/r:t"])[0] == "ok"
    assert check_invocation(["run", "--cache-dir", "/c", "--", "vllm", "--weird"])[0] == "ok"


# -- Kubernetes ----------------------------------------------------------------------------------


def deployments(path: Path) -> list[dict]:
    documents = list(yaml.safe_load_all(path.read_text()))
    assert documents and all(d["apiVersion"] == "apps/v1" and d["kind"] == "Deployment" for d in documents)
    return documents


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def mounts_by_path(container: dict) -> dict[str, dict]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


@pytest.mark.parametrize("path", [DEPLOYMENT, READONLY], ids=lambda p: p.name)
def test_manifests_are_consistent(path):
    for document in deployments(path):
        template = document["spec"]["template"]
        labels = template["metadata"]["labels"]
        assert document["spec"]["selector"]["matchLabels"].items() <= labels.items()
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        for container in containers(document):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (container["name"], mount["name"])
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        mounted = {m["name"] for c in containers(document) for m in c.get("volumeMounts", [])}
        assert mounted == set(volumes)  # no unused volume


def under(path: str, mounts: dict[str, dict]) -> dict | None:
    return next((m for root, m in mounts.items() if path == root or path.startswith(root.rstrip("/") + "/")), None)


def test_init_container_installs_into_the_volume_the_server_uses():
    [document] = deployments(DEPLOYMENT)
    volumes = {v["name"]: v for v in document["spec"]["template"]["spec"]["volumes"]}
    [init] = document["spec"]["template"]["spec"]["initContainers"]
    [server] = document["spec"]["template"]["spec"]["containers"]
    install, run = init["command"], server["command"]
    assert install[:2] == ["kernelcache", "install"] and run[:2] == ["kernelcache", "run"]
    reference = oci.parse(install[2])
    assert reference.tag and not reference.digest  # an index tag, resolved per GPU at install time
    cache_dir = option(install, "--cache-dir")
    assert option(run, "--cache-dir") == cache_dir
    shared_init, shared_server = under(cache_dir, mounts_by_path(init)), under(cache_dir, mounts_by_path(server))
    assert shared_init and shared_server and shared_init["name"] == shared_server["name"]
    assert "emptyDir" in volumes[shared_init["name"]]
    assert init["image"] == server["image"]  # one fingerprint: install checks it against the server's Triton
    env = {e["name"]: e["value"] for e in init["env"]}
    assert under(env["KERNELCACHE_DOWNLOAD_DIR"], mounts_by_path(init))["name"] == shared_init["name"]
    credentials = under(env["DOCKER_CONFIG"], mounts_by_path(init))
    secret = volumes[credentials["name"]]["secret"]
    assert credentials["readOnly"] and {"key": ".dockerconfigjson", "path": "config.json"} in secret["items"]


def test_the_init_container_refuses_bundles_the_ci_key_did_not_sign():
    [document] = deployments(DEPLOYMENT)
    volumes = {v["name"]: v for v in document["spec"]["template"]["spec"]["volumes"]}
    [init] = document["spec"]["template"]["spec"]["initContainers"]
    assert "--require-signature" in init["command"]
    key = option(init["command"], "--trusted-key")
    mount = under(key, mounts_by_path(init))
    assert mount["readOnly"] and "secret" in volumes[mount["name"]]  # an explicit file, mounted from a Secret
    assert os.path.relpath(key, mount["mountPath"]) in {i["path"] for i in volumes[mount["name"]]["secret"]["items"]}
    pushes = [c for c in workflow_commands() if c[:2] == ["kernelcache", "push"]]
    assert pushes and all("--sign" in c for c in pushes)  # what the CI job pushes is what the init container takes


def test_read_only_variant_mounts_an_image_volume_where_the_tree_was_installed():
    [document] = deployments(READONLY)
    volumes = {v["name"]: v for v in document["spec"]["template"]["spec"]["volumes"]}
    [server] = document["spec"]["template"]["spec"]["containers"]
    command = server["command"]
    assert command[:3] == ["kernelcache", "run", "--read-only"]
    cache_dir = option(command, "--cache-dir")
    base = mounts_by_path(server)[cache_dir]
    assert base["readOnly"] is True and "image" in volumes[base["name"]]
    reference = volumes[base["name"]]["image"]["reference"]
    assert "://" not in reference and re.search(r":[\w.-]+-sm_\d+-[\w-]+$", reference)  # a per-GPU tag
    assert any("emptyDir" in volumes[m["name"]] for m in server["volumeMounts"] if not m.get("readOnly"))
    installed_at = [option(c, "--cache-dir") for c in dockerfile_commands() if c[:2] == ["kernelcache", "install"]]
    assert installed_at == [cache_dir]  # group files hold absolute paths: mount where it was installed


def tool(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def require(name: str) -> str:
    found = tool(name)
    if found is None:
        pytest.skip(f"{name} is not installed (scripts/setup.sh installs it)")
    return found


def test_manifests_pass_the_kubernetes_schema():
    done = subprocess.run([require("kubernetes-validate"), "--strict", str(DEPLOYMENT), str(READONLY)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# -- Dockerfile ----------------------------------------------------------------------------------


def stages() -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    current = None
    for keyword, rest in dockerfile_instructions(DOCKERFILE):
        if keyword == "FROM":
            base, _, name = rest.partition(" AS ")
            current = name.strip() or base
            found[current] = [("FROM", base.strip())]
        elif current is not None:
            found[current].append((keyword, rest))
    return found


def test_dockerfile_builds_without_gpu_and_serves_from_the_same_image():
    found = stages()
    assert list(found)[-1] == "serve"  # the default target serves
    names = set(found)
    for instructions in found.values():
        for keyword, rest in instructions:
            for source in re.findall(r"from=([\w.-]+)", rest):
                assert source in names, source
            if keyword == "FROM" and rest not in ("scratch", "${VLLM_IMAGE}"):
                assert rest in names, rest
    base = {name: instructions[0][1] for name, instructions in found.items()}
    assert base["build"] == base["runtime"]  # one image, one fingerprint for build and serve
    image = base["build"]
    while image in found:
        image = base[image]
    assert image == "${VLLM_IMAGE}"
    build = [c for k, r in found["build"] if k == "RUN" for c in shell_commands(r)]
    assert any(c[:2] == ["kernelcache", "build"] and "--arch" in c for c in build)
    runtime = found["runtime"]
    env = dict(r.split("=", 1) for k, r in runtime if k == "ENV")
    entrypoint = yaml.safe_load(next(r for k, r in runtime if k == "ENTRYPOINT"))
    assert option(entrypoint, "--cache-dir") == env["TRITON_CACHE_DIR"]
    assert [k for k, _ in found["kernels"]] == ["FROM", "COPY"] and found["kernels"][0][1] == "scratch"


def test_dockerfile_passes_hadolint():
    done = subprocess.run([require("hadolint"), str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# -- CI workflow ---------------------------------------------------------------------------------


def test_workflow_builds_one_bundle_per_existing_gpu_and_pushes_to_a_valid_reference():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    [job] = workflow["jobs"].values()
    matrix = job["strategy"]["matrix"]["include"]
    variants = {(m["arch"], m["gpu"]) for m in matrix}
    assert len(variants) == len(matrix) >= 2 and len({a for a, _ in variants}) >= 2
    for arch, gpu in variants:
        assert profile(gpu).arch == arch
    pushes = [c for c in workflow_commands() if c[:2] == ["kernelcache", "push"]]
    assert pushes and all(oci.parse(c[-1].replace("X", "v1")).tag == "v1" for c in pushes)
    assert "packages" in workflow["permissions"]


def test_workflow_passes_the_github_actions_schema():
    checker = require("check-jsonschema")
    done = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def served_command(command: list[str]) -> list[str]:
    """What a `kernelcache run ... -- vllm serve MODEL ...` command serves: the words after `--`."""
    return command[command.index("--") + 1:]


def test_every_example_builds_for_the_serve_command_its_server_runs():
    """One source of truth: the Dockerfile's SERVE, the workflow's SERVE, the image's ENTRYPOINT + CMD and both
    Deployments' server commands are one serve command, and both builds take it after `--`."""
    found = stages()
    args = dict(r.split("=", 1) for k, r in dockerfile_instructions(DOCKERFILE) if k == "ARG" and "=" in r)
    serve = shlex.split(args["SERVE"].strip('"'))
    assert serve[:2] == ["vllm", "serve"] and len(serve) >= 3
    [build] = [r for k, r in found["build"] if k == "RUN" and "kernelcache build" in r]
    assert re.search(r"kernelcache build [^&]* -- \$\{SERVE\}", build), build
    entrypoint = yaml.safe_load(next(r for k, r in found["runtime"] if k == "ENTRYPOINT"))
    cmd = yaml.safe_load(next(r for k, r in found["runtime"] if k == "CMD"))
    assert served_command(entrypoint) + cmd == serve
    for path in (DEPLOYMENT, READONLY):
        [server] = [c for d in deployments(path) for c in d["spec"]["template"]["spec"]["containers"]]
        assert served_command(server["command"] + server.get("args", [])) == serve, path.name
    workflow = yaml.safe_load(WORKFLOW.read_text())
    [job] = workflow["jobs"].values()
    [step] = [s for s in job["steps"] if "kernelcache build" in s.get("run", "")]
    assert shlex.split(step["env"]["SERVE"]) == serve
    assert re.search(r"kernelcache build [^\n]* -- \$SERVE\n", step["run"]), step["run"]
