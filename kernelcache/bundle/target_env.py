"""A fingerprint file: one environment's cache-key fingerprint as JSON, and the check of a build against it.

``kernelcache fingerprint --json`` writes it in the serving image; ``kernelcache build --target-env FILE``
reads it and, before compiling anything, compares the bundle it is about to build (this interpreter's
fingerprint, the planned target and FlashInfer module) with it through the same ``compare`` that
``install`` runs there, so a bundle that would be refused at pod start is refused at build time.

The file holds the ``Environment`` fields (Python tag, platform, Triton version, sha256 of
``triton_key()``, ``ptxas --version`` per arch, the set cache-invalidating variables, torch, vLLM,
FlashInfer), the apache-tvm-ffi version, the CUDA versions (torch's build, the toolkit a FlashInfer
build would use) and the visible GPUs (arch, SM count). ``ptxas`` covers every arch of the GPU
profiles unless ``archs`` names fewer, so one file serves builds for any of them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import FingerprintMismatch, UsageError
from ..format.fingerprint import Difference, compare, compare_gpu, local_environment, package_version
from ..format.manifest import Build, Environment, FlashInferModule, Manifest, Target

SCHEMA = "kernelcache-fingerprint/1"


@dataclass(frozen=True)
class Gpu:
    """A visible GPU as the fingerprint records it (``plan.gpus.VisibleGpu``'s fields)."""

    index: int
    name: str
    capability: int
    sm_count: int

    @property
    def arch(self) -> str:
        return f"sm_{self.capability}"


@dataclass(frozen=True)
class Fingerprint:
    environment: Environment
    tvm_ffi: str | None = None
    torch_cuda: str | None = None  # "13.0": the CUDA torch was built with (torch.version.cuda)
    cuda_toolkit: str | None = None  # "13.0.88": the nvcc a FlashInfer build here would use, if present
    gpus: tuple[Gpu, ...] = ()

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, **dataclasses.asdict(self), "gpus": [dataclasses.asdict(g) for g in self.gpus]}

    @classmethod
    def from_dict(cls, data: dict) -> Fingerprint:
        fields = {f.name for f in dataclasses.fields(cls)}
        environment = Environment(**data["environment"])
        rest = {k: v for k, v in data.items() if k in fields and k not in ("environment", "gpus")}
        return cls(environment=environment, gpus=tuple(Gpu(**g) for g in data.get("gpus") or ()), **rest)


def take(archs: list[str] | None = None) -> Fingerprint:
    """This environment's fingerprint (imports triton; probes the GPUs in a child process)."""
    from ..plan.gpus import PROFILES, visible_gpus

    gpus = tuple(Gpu(**dataclasses.asdict(g)) for g in visible_gpus())
    wanted = archs or sorted({p.arch for p in PROFILES.values()} | {g.arch for g in gpus})
    return Fingerprint(environment=local_environment(wanted), tvm_ffi=package_version("apache-tvm-ffi"),
                       torch_cuda=torch_cuda(), cuda_toolkit=_toolkit_version(), gpus=gpus)


def load(path: str | os.PathLike) -> Fingerprint:
    """A fingerprint file written by ``kernelcache fingerprint --json``; ``UsageError`` if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the fingerprint file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(f"{path} is not a kernelcache fingerprint (run `kernelcache fingerprint --json > FILE` "
                         "in the serving image)")
    try:
        return Fingerprint.from_dict(data)
    except (KeyError, TypeError) as exc:
        raise UsageError(f"{path} is not a complete kernelcache fingerprint ({exc})") from None


def torch_cuda() -> str | None:
    """torch's ``version.cuda``, read from its ``version.py`` without importing torch (seconds)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None
    found = re.search(r"^cuda(?:\s*:\s*[^=]+)?\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return found.group(1) if found else None


def _toolkit_version() -> str | None:
    from ..errors import MissingDependency
    from ..exercise import flashinfer_sampling

    try:
        return flashinfer_sampling.find_toolchain().cuda
    except MissingDependency:
        present = flashinfer_sampling.installed_toolkit()
        return present.cuda if present else None


# -- build --target-env -------------------------------------------------------------------------


def planned_manifest(target: Target, flashinfer: bool) -> Manifest:
    """The manifest fields a build is about to record: this environment, the target, the FlashInfer module."""
    from ..exercise.flashinfer_sampling import CUDA_VERSION, MODULE

    modules = ()
    if flashinfer:
        modules = (FlashInferModule(name=MODULE, version=package_version("flashinfer-python") or "(not installed)",
                                    cuda=CUDA_VERSION, archs=(f"sm{target.capability}a",),
                                    tvm_ffi=package_version("apache-tvm-ffi"), files=()),)
    return Manifest(target=target, environment=local_environment([target.arch]), build=Build("planned", "cross"),
                    flashinfer=modules)


def differences(planned: Manifest, triton: bool, there: Fingerprint) -> list[Difference]:
    """What ``install`` in the fingerprinted environment would find different, blocking or not."""
    found = compare(planned, there.environment, triton=triton, tvm_ffi=there.tvm_ffi)
    return found + compare_gpu(planned.target, list(there.gpus))


def check(planned: Manifest, triton: bool, there: Fingerprint, source: str) -> None:
    """Raise ``FingerprintMismatch`` (exit 20, 21 for the GPU alone) as ``install`` would there."""
    from ..errors import ArchMismatch

    blocking = [d for d in differences(planned, triton, there) if d.blocking]
    if not blocking:
        return
    cls = ArchMismatch if all(d.field.startswith("gpu[") for d in blocking) else FingerprintMismatch
    raise cls(f"the bundle for {planned.target.arch} ({planned.target.gpu}) would be refused in the environment "
              f"of {source} ({len(blocking)} field(s) differ; 'here' is that environment); nothing was compiled. "
              "Build under that environment's Python, Triton and vLLM (the serving image itself)",
              [(d.field, d.bundle, d.local) for d in blocking])
