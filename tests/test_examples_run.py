"""The examples, run (issue 25): every command of each file in examples/, in order, parsed out of the file, in a
stand-in for its image, so that an example that drifts from what works fails here.

What stands in for what (nothing else of an example is changed):

* vLLM's image: a fresh ``pip install vllm==0.33.0`` venv without kernelcache (uv, from the serving stack's cache:
  hard links, seconds). The example's own ``pip install`` puts kernelcache in it: the wheel scripts/release.sh
  builds, in ``wheels/`` of the user's repository (the Docker build context and the workflow's checkout). A stage
  FROM another stage continues in its venv; the Kubernetes containers run the Dockerfile's ``kernelcache`` image.
* A container's file system: one directory stands for ``/`` (every absolute path in a command is taken under it;
  a bind mount of the build context maps to the context), and each container has a HOME and TMPDIR of its own.
* The registry host: ghcr.io is the loopback registry (tests/helpers/servers.py) behind htpasswd auth; the GitHub
  context (the matrix entry, ``github.ref_name``, ``github.actor``, ``secrets.GITHUB_TOKEN``) has test values.
  The workflow's first matrix job runs (the GPU the Dockerfile and the manifests name), then the push step of every
  matrix job at once against the one index, each with its own bundle (the first job's, and for the others that
  bundle under their target): the parallel pushes must converge on an index of all of them.
  KERNELCACHE_EXAMPLES_MATRIX=all runs every job whole, one after the other, then the pushes at once again.
* The signing key pair: the workflow's secret KERNELCACHE_SIGNING_KEY is a fresh ECDSA P-256 private key (PEM),
  and the Deployment's secret kernelcache-trusted-keys holds its public half; RUNNER_TEMP is a directory of the job.
* Kubernetes volumes: an emptyDir is an empty directory, the credentials secret a dockerconfigjson for that
  registry, the trusted-keys secret the public key above, the image volume the Dockerfile's ``kernels`` tree (the
  runtime stage's installed cache) bound read-only where the manifest mounts it.
* The node's GPU, for the init container that picks the bundle by it: a ``libcuda.so.1`` answering as the GPU
  the nodeSelector names (tests/helpers/gpu_node.py).
* ``vllm serve …`` (no GPU and no model here): tests/probes/served_sampler.py, which runs vLLM's sampler paths
  for the bundle's plan in the process ``kernelcache run`` execs and reports every compile(). Each server must
  compile nothing, from the cache dir its volumes hold.

Each example's run time is printed ("examples: ... ran in N s").
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from helpers.common import ROOT, clean_env
from helpers.gpu_node import libcuda_for
from helpers.keys import write_pair
from helpers.mounts import read_only
from helpers.servers import htpasswd_line, registry
from helpers.wheel import release, uv
from test_examples import DEPLOYMENT, DOCKERFILE, READONLY, WORKFLOW, dockerfile_instructions, stages
from test_serving_stack import serving_venv

from kernelcache.cachedir import STATE_DIR
from kernelcache.format.archive import read_manifest
from kernelcache.plan.gpus import PROFILES

pytestmark = [pytest.mark.serving, pytest.mark.slow, pytest.mark.timeout(3600)]
VLLM_IMAGE = "vllm/vllm-openai:v"  # + the vLLM release the stand-in venv installs
REGISTRY_HOST = "ghcr.io"
GITHUB = {"github.ref_name": "v0.33.0", "github.actor": "example-bot", "secrets.GITHUB_TOKEN": "token-of-the-job"}
PROBE = ROOT / "tests" / "probes" / "served_sampler.py"
PROBED_PATHS = {"registry", "mrv1", "mrv2"}  # what the server's stand-in runs (tests/probes/vllm_keys.py)
CONTAINER_PATH = re.compile(r"(?<![\w.:/$}-])/[\w.-]+(?:/[\w.-]+)*")


@pytest.fixture(scope="module")
def say(request):
    """Print a line past pytest's capture (each example's run time)."""
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")

    def write(line: str) -> None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"examples: {line}")

    return write


# -- the stand-ins -----------------------------------------------------------------------------------------------


@dataclass
class World:
    """What every example shares: the file system's root, the user's repository, the registry, the images."""

    fs: Path  # stands for / in every container
    repo: Path  # the user's repository: wheels/<kernelcache's wheel>
    work: Path  # per-container HOME and TMPDIR, job workspaces
    images: Path  # the venvs standing in for images (beside uv's cache: hard links)
    registry_host: str
    python: Path  # the serving stack's Python 3.12
    signing_key: Path  # the CI key pair (PEM): the workflow signs with it, the Deployment trusts its public half
    trusted_key: Path
    binds: dict[str, Path] = field(default_factory=dict)  # container path -> host path, for the command running now

    def place(self, path: str) -> Path:
        for target, source in sorted(self.binds.items(), key=lambda b: -len(b[0])):
            if path == target or path.startswith(target.rstrip("/") + "/"):
                return source / path[len(target):].lstrip("/")
        return self.fs / path.lstrip("/")

    def rooted(self, text: str) -> str:
        """A command's text with its container paths where the stand-in keeps them, the registry host swapped."""
        text = text.replace(f"oci://{REGISTRY_HOST}/", f"oci://{self.registry_host}/")
        return CONTAINER_PATH.sub(lambda m: str(self.place(m.group(0))), text)

    def image(self, reference: str, name: str) -> Path:
        """A fresh venv standing in for ``reference`` (vllm/vllm-openai:vX: ``pip install vllm==X``)."""
        assert reference.startswith(VLLM_IMAGE), f"no stand-in for the image {reference}"
        venv = self.images / name
        uv("venv", "-q", "--seed", "--python", str(self.python), str(venv))
        uv("pip", "install", "-q", "--python", str(venv / "bin" / "python"), f"vllm=={reference[len(VLLM_IMAGE):]}")
        assert not (venv / "bin" / "kernelcache").exists()
        return venv

    def container_env(self, venv: Path, name: str, **extra: str) -> dict[str, str]:
        home, tmp = self.work / name / "home", self.work / name / "tmp"
        home.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in clean_env().items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV", "PYTHON"))}
        env.update(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", HOME=str(home), TMPDIR=str(tmp),
                   PIP_CONFIG_FILE="/dev/null", **extra)
        return env


def run(command: list[str], env: dict[str, str], cwd: Path, what: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, (what, command, done.returncode, done.stdout[-3000:], done.stderr[-5000:])
    return done


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    python = serving_venv("KERNELCACHE_SERVING_VENV").root / "bin" / "python"
    top = tmp_path_factory.mktemp("examples")
    _, wheel = release(top / "dist")
    repo = top / "repo"
    (repo / "wheels").mkdir(parents=True)
    shutil.copy2(wheel, repo / "wheels" / wheel.name)
    images = ROOT / "build" / "example-images" / str(os.getpid())
    images.mkdir(parents=True)
    secured = tmp_path_factory.mktemp("registry")
    signing_key, trusted_key, _ = write_pair(tmp_path_factory.mktemp("keys"), "kernelcache")
    with registry(secured, htpasswd=htpasswd_line(GITHUB["github.actor"], GITHUB["secrets.GITHUB_TOKEN"])) as server:
        try:
            yield World(top / "fs", repo, top / "work", images, server.host, python, signing_key, trusted_key)
        finally:
            shutil.rmtree(images, ignore_errors=True)


# -- the Dockerfile ----------------------------------------------------------------------------------------------


@dataclass
class Stage:
    venv: Path | None  # None: FROM scratch
    env: dict[str, str]  # ENV, inherited by stages FROM this one
    entrypoint: list[str] | None = None
    args: dict[str, str] = field(default_factory=dict)


def global_args() -> dict[str, str]:
    """The ARG defaults declared before the first FROM."""
    found = {}
    for keyword, rest in dockerfile_instructions(DOCKERFILE):
        if keyword == "FROM":
            break
        name, _, value = rest.partition("=")
        found[name] = value.strip('"')  # Docker drops an ARG default's quotes
    return found


def mounts(flags: str, world: World) -> dict[str, Path]:
    """RUN --mount=type=bind,...: the container path each one binds, and the host path behind it."""
    binds = {}
    for flag in re.findall(r"--mount=(\S+)", flags):
        options = dict(part.split("=", 1) for part in flag.split(","))
        assert options.get("type") == "bind", flag
        stage_path = "from" in options  # another stage's file: the same place in the one file system
        binds[options["target"]] = world.place(options["source"]) if stage_path else world.repo / options["source"]
    return binds


def run_instruction(text: str, stage: Stage, world: World, name: str) -> None:
    flags, command = re.match(r"^((?:--\S+\s+)*)(.*)$", text, re.S).groups()
    world.binds = mounts(flags, world)
    try:
        env = world.container_env(stage.venv, f"docker-{name}", **{**stage.args, **stage.env})
        run(["/bin/sh", "-c", world.rooted(command)], env, world.fs, f"Dockerfile stage {name}: RUN {command}")
    finally:
        world.binds = {}


def docker_build(world: World) -> dict[str, Stage]:
    """Every stage of the Dockerfile, in order, as BuildKit builds the default target and its dependencies."""
    defaults, built = global_args(), {}
    world.fs.mkdir(parents=True, exist_ok=True)
    for name, ((_, base), *instructions) in stages().items():
        if base == "scratch":  # COPY only: an image of files, made from another stage's
            assert {keyword for keyword, _ in instructions} <= {"COPY"}, (name, instructions)
            built[name] = Stage(None, {})
            continue
        parent = built.get(base)
        venv = parent.venv if parent else world.image(re.sub(r"\$\{(\w+)\}", lambda m: defaults[m[1]], base), name)
        stage = Stage(venv, dict(parent.env) if parent else {}, parent.entrypoint if parent else None)
        for keyword, text in instructions:
            if keyword == "ARG":
                arg, _, default = text.partition("=")
                stage.args[arg] = default or defaults[arg]
            elif keyword == "ENV":
                variable, _, value = text.partition("=")
                stage.env[variable] = world.rooted(value)
            elif keyword == "RUN":
                run_instruction(text, stage, world, name)
            elif keyword == "ENTRYPOINT":
                stage.entrypoint = json.loads(text)
            elif keyword == "CMD":  # docker run's default arguments: after the ENTRYPOINT
                stage.entrypoint = [*stage.entrypoint, *json.loads(text)]
            else:
                raise AssertionError(f"the examples' runner does not know the instruction {keyword} ({name})")
        built[name] = stage
    return built


def copied_tree(stage: str) -> str:
    """The container path a FROM-scratch stage copies from another stage (COPY --from=S PATH /)."""
    [(_, copy)] = [(k, r) for k, r in stages()[stage] if k == "COPY"]
    source, target = shlex.split(re.sub(r"--from=\S+\s+", "", copy))
    assert target == "/", copy
    return source.rstrip("/")


@dataclass(frozen=True)
class Served:
    """A server's stand-in, run: where the wrapper put Triton's cache, and every compile()."""

    where: dict[str, str | None]
    events: list[dict]

    @property
    def misses(self) -> list[dict]:
        return [e for e in self.events if not e["hit"]]


def probe_args(bundle: Path) -> list[str]:
    manifest = read_manifest(bundle)
    plan = manifest.build.plan
    assert set(plan["paths"]) <= PROBED_PATHS, f"the server's stand-in runs {PROBED_PATHS}, the bundle has {plan}"
    [vocab] = plan["vocabs"]
    capability = manifest.target.arch.removeprefix("sm_")
    return [capability, str(manifest.target.sm_count), str(vocab["size"]), str(plan["max_num_seqs"]),
            ",".join(plan["paths"])]


def serve(command: list[str], probe: list[str], env: dict[str, str], world: World, what: str) -> Served:
    """``command`` with its server (``vllm serve …`` after ``--``) replaced by the probe, run."""
    separator = command.index("--")
    assert command[separator + 1:separator + 3] == ["vllm", "serve"], command
    wrapped = [world.rooted(w) for w in command[:separator + 1]] + ["python", str(PROBE), *probe]
    done = run(wrapped, env, world.fs, what)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines and "served" in lines[0], done.stdout[-2000:]
    return Served(lines[0]["served"], lines[1:])


def cache_files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*")
            if p.is_file() and p.relative_to(root).parts[0] != STATE_DIR}


@dataclass
class DockerRun:
    stages: dict[str, Stage]
    bundle: Path
    cache: Path  # /opt/kernelcache/cache, as the runtime stage installed it
    probe: list[str]
    seconds: float


@pytest.fixture(scope="module")
def dockerfile(world, say) -> DockerRun:
    """The Dockerfile's stages built (its ENTRYPOINT runs in test_dockerfile_serves_...)."""
    started = time.monotonic()
    built = docker_build(world)
    args = {**global_args(), **built["build"].args}
    [bundle] = world.place("/bundles").glob(f"*-{args['ARCH']}-{args['GPU']}.tar.zst")
    cache = Path(built["runtime"].env["TRITON_CACHE_DIR"])
    seconds = time.monotonic() - started
    say(f"Dockerfile (stages {', '.join(built)}) built in {seconds:.0f} s")
    return DockerRun(built, bundle, cache, probe_args(bundle), seconds)


# -- the workflow ------------------------------------------------------------------------------------------------


def expressions(text: str, matrix: dict[str, str], context: dict[str, str] = GITHUB) -> str:
    def value(match: re.Match) -> str:
        expression = match[1].strip()
        if expression.startswith("matrix."):
            return matrix[expression.removeprefix("matrix.")]
        return context[expression]  # KeyError: an expression the runner was not told about

    return re.sub(r"\$\{\{([^}]*)\}\}", value, text)


def run_job(job: dict, matrix: dict[str, str], world: World, name: str) -> Path:
    """One matrix job in a fresh container of its image: the checkout is the user's repository; every run: step
    in bash -e, as GitHub runs a step without a shell: key; the artifact upload checks its path."""
    venv = world.image(job["container"]["image"], name)
    workspace, runner_temp = world.work / name / "workspace", world.work / name / "runner-temp"
    workspace.mkdir(parents=True)
    runner_temp.mkdir(parents=True)
    context = {**GITHUB, "secrets.KERNELCACHE_SIGNING_KEY": world.signing_key.read_text()}
    for step in job["steps"]:
        uses = step.get("uses", "")
        if uses.startswith("actions/checkout@"):
            shutil.copytree(world.repo, workspace, dirs_exist_ok=True)
        elif uses.startswith("actions/upload-artifact@"):
            assert list((workspace / expressions(step["with"]["path"], matrix)).glob("*.tar.zst")), step
        else:
            assert "run" in step and not uses, f"the examples' runner does not know the step {step}"
            own = {k: expressions(v, matrix, context).replace(f"oci://{REGISTRY_HOST}/", f"oci://{world.registry_host}/")
                   for k, v in step.get("env", {}).items()}  # a registry in a variable: the build cache's
            env = world.container_env(venv, name, RUNNER_TEMP=str(runner_temp), **own)
            script = world.rooted(expressions(step["run"], matrix, context))
            run(["bash", "-e", "-c", script], env, workspace, f"workflow {name}: {step.get('name')}")
    return workspace


def matrix_jobs(job: dict) -> list[dict]:
    """The matrix entries to run: the first (the GPU the Dockerfile and the manifests name), or every one with
    KERNELCACHE_EXAMPLES_MATRIX=all (each is the same steps with other values, and about two minutes of CI)."""
    entries = job["strategy"]["matrix"]["include"]
    return entries if os.environ.get("KERNELCACHE_EXAMPLES_MATRIX") == "all" else entries[:1]


@pytest.fixture(scope="module")
def workflow(world, say) -> dict[str, Path]:
    """The workflow's matrix jobs (matrix_jobs), each pushing to the loopback registry: {job: workspace}."""
    [(job_name, job)] = yaml.safe_load(WORKFLOW.read_text())["jobs"].items()
    done = {}
    for matrix in matrix_jobs(job):
        name = f"{job_name}-{matrix['arch']}-{matrix['gpu']}"
        started = time.monotonic()
        done[name] = run_job(job, {k: str(v) for k, v in matrix.items()}, world, name)
        say(f"github-actions.yml job {name} ran in {time.monotonic() - started:.0f} s")
    started = time.monotonic()
    push_at_once(job, job_name, world, done)
    say(f"github-actions.yml: the push steps of {len(done)} matrix jobs ran at once in "
        f"{time.monotonic() - started:.0f} s")
    return done


def push_at_once(job: dict, job_name: str, world: World, done: dict[str, Path]) -> None:
    """The workflow's push step of every matrix job at the same time, as GitHub runs the jobs (fail-fast off), each
    from its own workspace into the one index. A job that did not run whole gets the first job's bundle under its
    own target (what is checked here is the index the parallel pushes leave, not the kernels); it is added to
    ``done``."""
    from helpers.bundles import rewrite

    [step] = [s for s in job["steps"] if "kernelcache push" in s.get("run", "")]
    first_name, first = next(iter(done.items()))
    [bundle] = (first / "bundles").glob("*.tar.zst")
    context = {**GITHUB, "secrets.KERNELCACHE_SIGNING_KEY": world.signing_key.read_text()}
    jobs = []
    for entry in job["strategy"]["matrix"]["include"]:
        matrix = {k: str(v) for k, v in entry.items()}
        name = f"{job_name}-{matrix['arch']}-{matrix['gpu']}"
        if name not in done:
            workspace = world.work / name / "workspace"
            shutil.copytree(world.repo, workspace)
            (workspace / "bundles").mkdir()
            rewrite(bundle, workspace / "bundles" / f"vllm-sampler-{matrix['arch']}-{matrix['gpu']}.tar.zst",
                    target={"arch": matrix["arch"], "gpu": matrix["gpu"],
                            "sm_count": PROFILES[matrix["gpu"]].sm_count})
            done[name] = workspace
        runner_temp = world.work / name / "runner-temp-push"
        runner_temp.mkdir(parents=True, exist_ok=True)
        own = {k: expressions(v, matrix, context) for k, v in step.get("env", {}).items()}
        env = world.container_env(world.images / first_name, f"{name}-push", RUNNER_TEMP=str(runner_temp), **own)
        script = world.rooted(expressions(step["run"], matrix, context))
        jobs.append((name, subprocess.Popen(["bash", "-e", "-c", script], env=env, cwd=done[name], text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    for name, process in jobs:
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, (f"workflow {name}: {step.get('name')} (at once)", out[-2000:], err[-3000:])


# -- the Kubernetes manifests ------------------------------------------------------------------------------------


def node_gpu(spec: dict) -> str:
    """The GPU profile whose product the pod's nodeSelector names (nvidia.com/gpu.product: NVIDIA-H200)."""
    label = spec["nodeSelector"]["nvidia.com/gpu.product"]
    [name] = [p.name for p in PROFILES.values() if p.product.replace(" ", "-") == label]
    return name


def docker_config(world: World) -> str:
    auth = base64.b64encode(f"{GITHUB['github.actor']}:{GITHUB['secrets.GITHUB_TOKEN']}".encode()).decode()
    return json.dumps({"auths": {world.registry_host: {"auth": auth}}})


def pod_volumes(spec: dict, world: World, pod: str) -> dict[str, Path]:
    """Each volume's directory: an emptyDir new and empty, a secret's items projected, an image volume the
    Dockerfile's `kernels` tree (where the runtime stage installed it; the caller makes it read-only)."""
    found = {}
    for volume in spec["volumes"]:
        where = world.work / pod / "volumes" / volume["name"]
        if "emptyDir" in volume:
            where.mkdir(parents=True)
        elif "secret" in volume:
            content = {("registry-credentials", ".dockerconfigjson"): docker_config(world),
                       ("kernelcache-trusted-keys", "kernelcache.pub"): world.trusted_key.read_text()}
            where.mkdir(parents=True)
            for item in volume["secret"]["items"]:
                (where / item["path"]).write_text(content[volume["secret"]["secretName"], item["key"]])
        elif "image" in volume:
            assert "vllm-kernels-tree" in volume["image"]["reference"], volume  # examples/Dockerfile --target kernels
            where = world.place(copied_tree("kernels"))
        else:
            raise AssertionError(f"the examples' runner has no stand-in for the volume {volume}")
        found[volume["name"]] = where
    return found


@dataclass
class PodRun:
    served: Served
    init: list[subprocess.CompletedProcess]
    volumes: dict[str, Path]
    seconds: float


def run_container(container: dict, volumes: dict[str, Path], world: World) -> list[str]:
    """Mount the container's volumes and return its command, its paths where the stand-in keeps them."""
    world.binds = {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}
    return [world.rooted(w) for w in container["command"]]


def run_pod(path: Path, world: World, venv: Path, probe: list[str]) -> PodRun:
    """The init containers in order (each must succeed), then the server with its stand-in."""
    [document] = yaml.safe_load_all(path.read_text())
    spec = document["spec"]["template"]["spec"]
    volumes = pod_volumes(spec, world, path.stem)
    started, init = time.monotonic(), []
    try:
        for container in spec.get("initContainers", []):
            gpu = libcuda_for(node_gpu(spec), world.work / path.stem / "gpu")
            command = run_container(container, volumes, world)
            env = container_env(container, venv, world, f"{path.stem}-{container['name']}", LD_LIBRARY_PATH=str(gpu))
            init.append(run(command, env, world.fs, f"{path.name}: init container {container['name']}"))
        [server] = spec["containers"]
        run_container(server, volumes, world)
        env = container_env(server, venv, world, f"{path.stem}-{server['name']}")
        served = serve(server["command"], probe, env, world, f"{path.name}: container {server['name']}")
    finally:
        world.binds = {}
    return PodRun(served, init, volumes, time.monotonic() - started)


def container_env(container: dict, venv: Path, world: World, name: str, **extra: str) -> dict[str, str]:
    own = {e["name"]: world.rooted(e["value"]) for e in container.get("env", [])}
    return world.container_env(venv, name, **{**own, **extra})


def volume_of(path: str, pod: PodRun) -> str:
    """The name of the pod's volume that holds the host path ``path``."""
    for name, where in pod.volumes.items():
        if Path(path).is_relative_to(where):
            return name
    raise AssertionError(f"{path} is on no volume of the pod ({pod.volumes})")


@pytest.fixture(scope="module")
def readonly(world, dockerfile, say) -> PodRun:
    """deployment-readonly.yaml, with the Dockerfile's `kernels` tree as its image volume, bound read-only where
    it was installed. It runs before the serve image's container, whose `kernelcache run` keeps records in its
    cache dir: in Docker they land in that container's layer, never in the `kernels` image."""
    tree = world.place(copied_tree("kernels"))
    with read_only(tree, tree):
        pod = run_pod(READONLY, world, dockerfile.stages["kernelcache"].venv, dockerfile.probe)
    say(f"deployment-readonly.yaml ran in {pod.seconds:.0f} s")
    return pod


@pytest.fixture(scope="module")
def deployment(world, dockerfile, workflow, say) -> PodRun:
    """deployment.yaml, installing from the index the workflow's jobs pushed."""
    pod = run_pod(DEPLOYMENT, world, dockerfile.stages["kernelcache"].venv, dockerfile.probe)
    say(f"deployment.yaml ran in {pod.seconds:.0f} s")
    return pod


# -- the checks --------------------------------------------------------------------------------------------------


def test_the_dockerfile_builds_the_bundle_and_installs_it_in_the_runtime_stage(dockerfile):
    manifest = read_manifest(dockerfile.bundle)
    assert manifest.environment.triton == "3.8.0" and manifest.kernels
    assert len(list((dockerfile.cache / STATE_DIR / "installed").glob("*.json"))) == 1
    assert len(cache_files(dockerfile.cache)) >= len(manifest.kernels)
    venv = dockerfile.stages["kernelcache"].venv
    [installed] = (venv / "lib").glob("python3.*/site-packages/kernelcache-*.dist-info")
    origin = json.loads((installed / "direct_url.json").read_text())
    assert origin["url"].endswith(".whl") and "archive_info" in origin  # the wheel, not an editable checkout


def test_the_read_only_deployment_serves_from_the_image_volume_and_compiles_nothing(readonly, dockerfile):
    assert readonly.served.events and not readonly.served.misses, readonly.served.misses[:5]
    where = readonly.served.where
    assert volume_of(where["KERNELCACHE_BASE_DIR"], readonly) == "kernels"
    assert volume_of(where["TRITON_CACHE_DIR"], readonly) == "overlay"  # misses would go to the emptyDir
    log = Path(where["KERNELCACHE_MISS_LOG"])
    assert volume_of(str(log), readonly) == "overlay" and (not log.exists() or not log.read_text())


def test_the_dockerfile_serve_image_compiles_nothing(dockerfile, readonly, world, say):
    runtime = dockerfile.stages["serve"]
    before = cache_files(dockerfile.cache)
    started = time.monotonic()
    env = world.container_env(runtime.venv, "docker-serve", **runtime.env)
    served = serve(runtime.entrypoint, dockerfile.probe, env, world, "Dockerfile ENTRYPOINT")
    say(f"Dockerfile ENTRYPOINT (the serve target) ran in {time.monotonic() - started:.0f} s")
    assert served.events and not served.misses, served.misses[:5]
    assert Path(served.where["TRITON_CACHE_DIR"]) == dockerfile.cache
    assert cache_files(dockerfile.cache) == before


def test_the_workflow_jobs_build_and_push_to_one_index(workflow, world):
    from kernelcache.remote import oci

    [job] = yaml.safe_load(WORKFLOW.read_text())["jobs"].values()
    variants = {f"{m['arch']}-{m['gpu']}" for m in job["strategy"]["matrix"]["include"]}
    assert len(workflow) == len(variants) == 3  # every matrix job pushed, at once (push_at_once)
    request = urllib.request.Request(
        f"http://{world.registry_host}/v2/example-org/vllm-kernels/manifests/{GITHUB['github.ref_name']}",
        headers={"Accept": oci.OCI_INDEX, "Authorization": "Basic " + base64.b64encode(
            f"{GITHUB['github.actor']}:{GITHUB['secrets.GITHUB_TOKEN']}".encode()).decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        index = json.loads(response.read())
    assert {d["annotations"][f"{oci.ANNOTATION}variant"] for d in index["manifests"]} == variants


def test_the_deployment_installs_from_the_registry_and_its_server_compiles_nothing(deployment):
    [init] = deployment.init
    assert re.search(r"installed \d+ entries", init.stdout), init.stdout
    assert "(a trusted key)" in init.stdout  # the workflow signed what the init container's policy required
    assert deployment.served.events and not deployment.served.misses, deployment.served.misses[:5]
    assert volume_of(deployment.served.where["TRITON_CACHE_DIR"], deployment) == "kernelcache"
    assert deployment.served.where["TRITON_CACHE_MANAGER"] is None
