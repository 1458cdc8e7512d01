"""FlashInfer's ``sampling`` JIT module as bundle members: built for a named arch, or taken from a JIT dir.

vLLM's default CUDA sampler (``flashinfer_sample``) runs FlashInfer's ``sampling`` module, one
``sampling.so`` that nvcc + ninja build at first use (``get_sampling_module`` in flashinfer/sampling.py).

* ``build_sampling`` (cross mode) builds it without a GPU: FlashInfer's own ``gen_sampling_module()
  .build()`` in a child process, with ``FLASHINFER_CUDA_ARCH_LIST`` naming the target and nvcc from
  ``ensure_toolchain``: the pip CUDA wheels ``setup_toolchain`` installed, else a CUDA toolkit of the
  same major already on ``CUDA_HOME``/``PATH``, else the pip wheels fetched there and then (once;
  cached for the next build). The child reports what FlashInfer built and for which archs.
* ``harvest_sampling`` (native mode) takes the ``sampling.so`` a FlashInfer JIT already built in
  its JIT dir (``<base>/.cache/flashinfer/<version>/<archs>/cached_ops``).

Both check the result (an ELF whose fatbin holds exactly the expected SASS, via cuobjdump) and
return a ``FlashInferModule`` (``files=()``; ``make_bundle`` hashes) plus one ``format.manifest.Member``:
``flashinfer/<version>-<archs>-<sha12>/sampling/sampling.so``. The directory above the module is
what runtime/flashinfer_env.py registers as a FlashInfer jit-cache provider; the sha in its name
keeps two different builds from ever sharing a path in one cache dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildFailed, MissingDependency, ToolchainUnavailable, UsageError
from ..format.fingerprint import package_version
from ..format.manifest import FLASHINFER_ROOT, FlashInferModule, Member, arch_to_capability
from ..usercache import user_cache

MODULE = "sampling"
# The CUDA 13.0 wheels that build sampling: nvcc with its crt and nvvm parts, the runtime, curand's
# headers; nvcc, crt and runtime must share one CUDA version. cuobjdump is only on PyPI from 13.2;
# it reads 13.0 fatbins.
CUDA_VERSION = "13.0.88"
CUDA_WHEELS = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-curand==10.4.0.35",
    "nvidia-cuda-cuobjdump==13.2.51",
    "ninja==1.13.2",
)
_MARKER = "kernelcache-toolchain.json"
_ELF = b"\x7fELF"
# Variables that would change what FlashInfer builds or where; the build child gets only ours.
_BUILD_VARS = ("FLASHINFER_", "CUDA_HOME", "CUDA_PATH", "MAX_JOBS", "TORCH_CUDA_ARCH_LIST")


@dataclass(frozen=True)
class Toolchain:
    """A CUDA toolkit layout FlashInfer can build with (``CUDA_HOME``) and the ninja it runs."""

    root: Path  # bin/nvcc, include/{cuda_runtime,curand}.h, lib64/libcudart.so, lib64/stubs/libcuda.so
    ninja_dir: Path
    cuda: str  # "13.0.88", from nvcc --version

    @property
    def cuobjdump(self) -> Path | None:
        path = self.root / "bin" / "cuobjdump"
        return path if path.is_file() else None


# -- toolchain --------------------------------------------------------------------------------------


def default_toolchain_dir() -> Path:
    """Where ``setup_toolchain`` installs: KERNELCACHE_TOOLCHAIN_DIR, else ~/.cache/kernelcache/toolchains."""
    if os.environ.get("KERNELCACHE_TOOLCHAIN_DIR"):
        return Path(os.environ["KERNELCACHE_TOOLCHAIN_DIR"])
    return user_cache("toolchains")


def workspace_dir() -> Path:
    """Where builds let FlashInfer build its JIT modules (its ``FLASHINFER_WORKSPACE_BASE``): kept between builds,
    so ninja rebuilds only what changed, as in FlashInfer's own JIT cache. KERNELCACHE_FLASHINFER_WORKSPACE, else
    ``flashinfer-jit`` beside the toolchains."""
    given = os.environ.get("KERNELCACHE_FLASHINFER_WORKSPACE")
    return Path(given) if given else default_toolchain_dir().parent / "flashinfer-jit"


def toolchain_path(base: Path | None = None) -> Path:
    return (base or default_toolchain_dir()) / f"cuda-{CUDA_VERSION}"


def ensure_toolchain(base: Path | None = None, say: Callable[[str], None] | None = None) -> Toolchain:
    """A toolchain to build with, obtained now if need be; ``ToolchainUnavailable`` (exit 33) if it cannot be.

    Order: the one ``setup_toolchain`` installed under ``base``; a CUDA toolkit of the same major as
    ``CUDA_VERSION`` already on ``CUDA_HOME``/``CUDA_PATH`` or ``PATH`` (with ninja on ``PATH``); else the
    pinned pip wheels, fetched now with progress lines through ``say`` (stderr by default).
    """
    say = say or _stderr
    try:
        return find_toolchain(base)
    except MissingDependency:
        pass
    present = installed_toolkit()
    if present is not None:
        say(f"using the CUDA {present.cuda} toolkit in {present.root} to build FlashInfer's {MODULE} module")
        return present
    say(f"fetching the CUDA {CUDA_VERSION} build toolchain for FlashInfer's {MODULE} module "
        f"({len(CUDA_WHEELS)} pip wheels, about 150 MB) into {toolchain_path(base)}; later builds reuse it")
    started = time.monotonic()
    tools = setup_toolchain(base, say)
    say(f"CUDA {tools.cuda} toolchain ready in {time.monotonic() - started:.0f}s")
    return tools


def installed_toolkit() -> Toolchain | None:
    """A CUDA toolkit already on this machine that FlashInfer can build with, of ``CUDA_VERSION``'s major."""
    ninja = shutil.which("ninja")
    if ninja is None:
        return None
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    for root in (Path(c) for c in candidates if c):
        if _missing_files(root) or not (root / "bin" / "nvcc").is_file():
            continue
        try:
            cuda = nvcc_version(root / "bin" / "nvcc")
        except MissingDependency:
            continue
        if cuda.split(".")[0] == CUDA_VERSION.split(".")[0]:
            return Toolchain(root=root, ninja_dir=Path(ninja).parent, cuda=cuda)
    return None


def setup_toolchain(base: Path | None = None, say: Callable[[str], None] | None = None) -> Toolchain:
    """Install the pinned pip CUDA wheels into a directory of their own, plus the two link shims.

    A separate ``pip --target`` dir (uv's, where this interpreter has no pip: ``installer``) never touches the
    user's environment (a CUDA torch depends on some of the same wheels). pip's cache keeps reruns fast.
    Published with one rename; idempotent.
    ``say`` gets pip's progress lines (what it collects and downloads).
    """
    final = toolchain_path(base)
    if _marker_ok(final):
        return find_toolchain(base)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    except OSError as exc:
        raise ToolchainUnavailable(f"cannot create the CUDA toolchain dir {final}: {exc.strerror or exc}") from None
    try:
        _install_wheels(staging, say or (lambda line: None))
        _add_link_shims(staging / "nvidia" / "cu13")
        (staging / _MARKER).write_text(json.dumps({"wheels": list(CUDA_WHEELS)}, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
    except OSError as exc:
        raise ToolchainUnavailable(f"cannot install the CUDA toolchain into {final}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return find_toolchain(base)


# The progress lines passed on: pip's, and uv's (Resolved / Prepared / Installed, then one "+ name==version" a wheel).
_PROGRESS = ("Collecting", "Downloading", "Using cached", "Processing", "Installing", "Successfully", "Resolved",
             "Prepared", "Installed", "+ ")


def _install_wheels(target: Path, say: Callable[[str], None], wheels: tuple[str, ...] = CUDA_WHEELS) -> None:
    """Install ``wheels`` into ``target`` (no dependencies, binaries only), passing the progress lines to ``say``."""
    command = [*installer(), "--no-deps", "--only-binary", ":all:", "--target", str(target), *wheels]
    lines: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
        for line in pip.stdout or ():
            lines.append(line.rstrip())
            if line.strip().startswith(_PROGRESS):
                say(f"  {line.strip()}")
    if pip.returncode != 0:
        fetcher = "pip" if command[1:3] == ["-m", "pip"] else "uv"
        raise ToolchainUnavailable(
            f"{fetcher} could not fetch the CUDA {CUDA_VERSION} toolchain that builds FlashInfer's {MODULE} "
            f"module ({_last_line(chr(10).join(lines))}); check the network and disk space, or {_OTHERWISE}")


_OTHERWISE = (f"put a CUDA {CUDA_VERSION.split('.')[0]} toolkit on CUDA_HOME, or build without it: "
              "--path registry --path mrv1 --path mrv2")


def installer() -> list[str]:
    """The install command the toolchain is fetched with: this interpreter's pip, else uv on PATH for this
    interpreter (a venv made by ``uv venv`` has no pip unless ``--seed``); ``ToolchainUnavailable`` if neither."""
    import importlib.util

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
    uv = shutil.which("uv")
    if uv is not None:
        return [uv, "pip", "install", "--python", sys.executable]
    raise ToolchainUnavailable(
        f"{sys.executable} has no pip (a venv `uv venv` made without --seed) and no uv is on PATH, so the CUDA "
        f"{CUDA_VERSION} toolchain that builds FlashInfer's {MODULE} module cannot be fetched: put uv on PATH, "
        f"or install pip there ({sys.executable} -m ensurepip), or {_OTHERWISE}")


def _stderr(line: str) -> None:
    print(f"kernelcache: {line}", file=sys.stderr, flush=True)


def find_toolchain(base: Path | None = None) -> Toolchain:
    """The toolchain ``setup_toolchain`` installed; a clear error naming the fix if it is not there."""
    top = toolchain_path(base)
    root = top / "nvidia" / "cu13"
    missing = _missing_files(root)
    if not _marker_ok(top) or missing:
        raise MissingDependency(
            f"no CUDA {CUDA_VERSION} build toolchain in {top}"
            + (f" (missing {', '.join(missing)})" if _marker_ok(top) else "")
            + '; `kernelcache build` fetches it, or run: python -c '
            '"from kernelcache.exercise.flashinfer_sampling import setup_toolchain; setup_toolchain()"'
        )
    return Toolchain(root=root, ninja_dir=top / "bin", cuda=nvcc_version(root / "bin" / "nvcc"))


def nvcc_version(nvcc: Path) -> str:
    """``13.0.88`` from ``nvcc --version`` (``... release 13.0, V13.0.88``)."""
    try:
        text = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise MissingDependency(f"cannot run {nvcc} --version: {exc}") from None
    found = re.search(r"release [\d.]+, V(\d+\.\d+\.\d+)", text)
    if not found:
        raise MissingDependency(f"cannot read the CUDA version from {nvcc} --version")
    return found.group(1)


def _missing_files(root: Path) -> list[str]:
    """What FlashInfer's build needs from a toolkit root (``CUDA_HOME``) that is not there."""
    needed = ("bin/nvcc", "include/cuda_runtime.h", "include/curand.h", "lib64/libcudart.so",
              "lib64/stubs/libcuda.so")
    return [n for n in needed if not (root / n).exists()]


def _marker_ok(top: Path) -> bool:
    try:
        return json.loads((top / _MARKER).read_text()).get("wheels") == list(CUDA_WHEELS)
    except (OSError, ValueError, AttributeError):
        return False


def _add_link_shims(root: Path) -> None:
    """FlashInfer links with ``-L$cuda_home/lib64{,/stubs} -lcudart -lcuda``; pip ships neither name."""
    (root / "lib64" / "stubs").mkdir(parents=True, exist_ok=True)
    (root / "lib64" / "libcudart.so").symlink_to("../lib/libcudart.so.13")
    source = root / "lib64" / "stubs" / "libcuda_stub.c"
    source.write_text("/* link-time stand-in for the driver; the real libcuda.so.1 is loaded at run time */\n")
    cc = os.environ.get("CC") or "gcc"
    done = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                           str(root / "lib64" / "stubs" / "libcuda.so"), str(source)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ToolchainUnavailable(f"cannot build the libcuda link stub with {cc}: {_last_line(done.stderr)}")


# -- building (cross) and taking (native) -----------------------------------------------------------


def arch_list(arch: str) -> str:
    """``sm_90`` -> ``9.0``: the ``FLASHINFER_CUDA_ARCH_LIST`` entry; FlashInfer adds the a/f suffix."""
    try:
        capability = arch_to_capability(arch)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return f"{capability // 10}.{capability % 10}"


def build_sampling(arch: str, workdir: Path, jobs: int = 2,
                   toolchain: Toolchain | None = None) -> tuple[FlashInferModule, list[Member]]:
    """Build the installed FlashInfer's ``sampling`` module for ``arch`` (``sm_90``) without a GPU."""
    if package_version("flashinfer-python") is None:
        raise MissingDependency("flashinfer-python is not installed here; install the serving image's version")
    arch_list(arch)  # a bad name fails here, before anything runs
    tools = toolchain or ensure_toolchain()
    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    report = _run_build_child(arch, workdir, jobs, tools)
    archs = tuple(report["archs"])
    if {arch_to_capability(a) for a in archs} != {arch_to_capability(arch)}:
        raise BuildFailed(f"FlashInfer built {MODULE} for {', '.join(archs) or 'no arch'}, not {arch}")
    data = _checked_library(Path(report["library"]), archs, tools.cuobjdump)
    module = FlashInferModule(name=MODULE, version=report["version"], cuda=tools.cuda, archs=archs,
                              tvm_ffi=report["tvm_ffi"], files=())
    return module, [Member(member_path(module, data), data=data)]


def harvest_sampling(jit_dir: Path, arch: str | None = None) -> tuple[FlashInferModule, list[Member]]:
    """Take ``sampling.so`` from a FlashInfer JIT dir (``.../<version>/<archs>/cached_ops``) a run filled.

    The version and archs come from the directory names FlashInfer chose, checked against the
    installed flashinfer-python and ``arch``; the CUDA version from the nvcc its ``build.ninja`` ran.
    """
    jit_dir = Path(jit_dir)
    library = jit_dir / MODULE / f"{MODULE}.so"
    if not library.is_file():
        raise UsageError(f"{jit_dir} holds no {MODULE}/{MODULE}.so: run the engine (or its sampler) first")
    version, archs = jit_dir.parent.parent.name, _archs_from_dir(jit_dir.parent.name)
    installed = package_version("flashinfer-python")
    if version != installed:
        raise UsageError(f"{jit_dir} was built by flashinfer {version}, but flashinfer {installed} is installed")
    if arch is not None and arch_to_capability(arch) not in {arch_to_capability(a) for a in archs}:
        raise UsageError(f"{jit_dir} holds a {MODULE} module for {', '.join(archs)}, not {arch}")
    ninja_file = jit_dir / MODULE / "build.ninja"
    if ninja_file.is_file() and "--device-debug" in ninja_file.read_text():
        raise UsageError(f"{jit_dir} holds a debug build (FLASHINFER_JIT_DEBUG); rebuild without it")
    cuda, cuobjdump = _cuda_of_jit_build(ninja_file, library)
    data = _checked_library(library, archs, cuobjdump)
    module = FlashInferModule(name=MODULE, version=version, cuda=cuda, archs=archs,
                              tvm_ffi=package_version("apache-tvm-ffi"), files=())
    return module, [Member(member_path(module, data), data=data)]


def take_module(library: Path, arch: str, cuda: str, sources: tuple[str, ...] = (),
                sources_sha256: str | None = None) -> tuple[FlashInferModule, list[Member]]:
    """A JIT module FlashInfer built (``<jit_dir>/<uri>/<uri>.so``, by nvcc here or on the GPU) as bundle members.

    The archs come from the workspace dir FlashInfer chose (``.../<version>/<archs>/cached_ops``), checked against
    ``arch`` and against the SASS in the library; ``cuda``: the nvcc that built it."""
    library = Path(library)
    jit_dir = library.parent.parent
    version, archs = jit_dir.parent.parent.name, _archs_from_dir(jit_dir.parent.name)
    if arch_to_capability(arch) not in {arch_to_capability(a) for a in archs}:
        raise BuildFailed(f"{library} was built for {', '.join(archs)}, not {arch}")
    found, cuobjdump = _cuda_of_jit_build(library.parent / "build.ninja", library)
    data = _checked_library(library, archs, cuobjdump)
    module = FlashInferModule(name=library.parent.name, version=version, cuda=cuda or found, archs=archs,
                              tvm_ffi=package_version("apache-tvm-ffi"), files=(), sources=tuple(sources),
                              sources_sha256=sources_sha256)
    return module, [Member(member_path(module, data), data=data)]


def member_path(module: FlashInferModule, data: bytes) -> str:
    """``flashinfer/0.7.2.post1-90a-<sha12>/sampling/sampling.so`` (4 components, the archive limit)."""
    tag = "_".join(a.removeprefix("sm") for a in module.archs)
    digest = hashlib.sha256(data).hexdigest()[:12]
    return f"{FLASHINFER_ROOT}/{module.version}-{tag}-{digest}/{module.name}/{module.name}.so"


def cubin_archs(library: Path, cuobjdump: Path) -> tuple[list[str], list[str]]:
    """(SASS archs, PTX archs) in a library's fatbin, e.g. (["sm_90a"], [])."""
    def listing(flag: str) -> list[str]:
        done = subprocess.run([str(cuobjdump), flag, str(library)], capture_output=True, text=True)
        if done.returncode != 0 and "does not contain" not in done.stderr + done.stdout:
            raise BuildFailed(f"cuobjdump {flag} {library} failed: {_last_line(done.stderr)}")
        return sorted(set(re.findall(r"\.(sm_\d+[af]?)\.(?:cubin|ptx)", done.stdout)))

    return listing("--list-elf"), listing("--list-ptx")


def build_variables(arch: str, workdir: Path, jobs: int, tools: Toolchain) -> dict[str, str]:
    """What a process that builds FlashInfer modules for ``arch`` needs set: the target, the toolkit and ninja on
    PATH, where FlashInfer builds (``workdir``) and how many nvcc jobs run at once."""
    return {
        "FLASHINFER_WORKSPACE_BASE": str(workdir),
        "FLASHINFER_CUDA_ARCH_LIST": arch_list(arch),
        "CUDA_HOME": str(tools.root),
        "PATH": os.pathsep.join([str(tools.root / "bin"), str(tools.ninja_dir), os.environ.get("PATH", "")]),
        "MAX_JOBS": str(max(1, jobs)),
        "FLASHINFER_NVCC_THREADS": "1",
    }


def nvcc_jobs() -> int:
    """nvcc processes at once: ``MAX_JOBS`` (FlashInfer's own variable) where set, else up to 2 (one per core)."""
    given = os.environ.get("MAX_JOBS", "")
    return int(given) if given.isdigit() and int(given) > 0 else min(2, os.cpu_count() or 1)


def _run_build_child(arch: str, workdir: Path, jobs: int, tools: Toolchain) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_BUILD_VARS)}
    env.update({**build_variables(arch, workdir, jobs, tools), "CUDA_VISIBLE_DEVICES": ""})
    report = workdir / "flashinfer-build.json"
    report.unlink(missing_ok=True)
    log = workdir / "flashinfer-build.log"
    with open(log, "w", encoding="utf-8") as out:
        done = subprocess.run([sys.executable, "-m", "kernelcache.exercise.flashinfer_sampling", str(report)], env=env,
                              stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0 or not report.is_file():
        raise BuildFailed(f"building FlashInfer {MODULE} for {arch} failed (exit {done.returncode}): "
                          f"{_last_line(log.read_text(errors='replace'))} (full log: {log})")
    return json.loads(report.read_text())


def _build_in_this_process(report: Path) -> None:
    """The child: FlashInfer's own spec and build, then what it built, as JSON."""
    import tvm_ffi
    from flashinfer.jit import core
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.sampling import gen_sampling_module

    spec = gen_sampling_module()
    spec.build(verbose=True)
    archs = sorted(f"sm{major}{minor}" for major, minor in core.current_compilation_context.TARGET_CUDA_ARCHS)
    report.write_text(json.dumps({"library": str(spec.jit_library_path), "archs": archs,
                                  "version": jit_env.flashinfer_version, "tvm_ffi": tvm_ffi.__version__}))


def _checked_library(library: Path, archs: tuple[str, ...], cuobjdump: Path | None) -> bytes:
    """The library's bytes, once it is known to be an ELF with SASS for exactly ``archs``."""
    data = library.read_bytes()
    if not data.startswith(_ELF):
        raise BuildFailed(f"{library} is not an ELF shared object")
    if cuobjdump is not None:
        sass, _ = cubin_archs(library, cuobjdump)
        wanted = sorted({f"sm_{a.removeprefix('sm')}" for a in archs})
        if sass != wanted:
            raise BuildFailed(f"{library} holds SASS for {', '.join(sass) or 'nothing'}, expected {', '.join(wanted)}")
    return data


def _archs_from_dir(name: str) -> tuple[str, ...]:
    """FlashInfer's workspace dir name (``90a`` or ``90a_100a``) -> (``sm90a``, ...)."""
    parts = name.split("_") if name else []
    if not parts or not all(re.fullmatch(r"\d{2,3}[af]?", p) for p in parts):
        raise UsageError(f"cannot read target archs from FlashInfer workspace dir name {name!r}")
    return tuple(f"sm{p}" for p in parts)


def _cuda_of_jit_build(ninja_file: Path, library: Path) -> tuple[str, Path | None]:
    """The CUDA version (and a cuobjdump) of the toolkit a JIT build used, from its build.ninja."""
    try:
        found = re.search(r"^cuda_home = (.+)$", ninja_file.read_text(), re.MULTILINE)
    except OSError:
        found = None
    if found:
        home = Path(found.group(1).strip())
        if (home / "bin" / "nvcc").is_file():
            cuobjdump = home / "bin" / "cuobjdump"
            return nvcc_version(home / "bin" / "nvcc"), cuobjdump if cuobjdump.is_file() else None
    needed = re.search(rb"libcudart\.so\.(\d+)", library.read_bytes())
    if not needed:
        raise UsageError(f"cannot tell which CUDA built {library}")
    return needed.group(1).decode(), None


def _last_line(text: str) -> str:
    """The first line that reports an error, else the last line: what a one-line message should show."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\berror\b", line, re.IGNORECASE)]
    return (errors or lines or ["(no output)"])[0 if errors else -1]


if __name__ == "__main__":
    _build_in_this_process(Path(sys.argv[1]))
