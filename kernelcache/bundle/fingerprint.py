"""The environment fingerprint: what must be equal on both sides for a bundle to hit.

Triton's cache key is ``triton_key()-src.hash()-backend.hash()-options.hash()-env_vars``
(shared/research/triton-cache.md). ``triton_key()`` changes with the wheel (and with the Python
minor, which picks ``libtriton.so``), ``backend.hash()`` is the ptxas ``--version`` text plus the
arch, ``options`` take ``PTXAS_OPTIONS`` and a few knobs from the environment, and the env-var part
is the set of cache-invalidating variables that are *set* (even to their default). The kernel
sources come from vLLM, so its version is pinned too. torch is recorded but is not in the key.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import MissingDependency
from .manifest import Environment, Manifest, Target, arch_to_capability

# Read by Triton into CUDAOptions (and so into the key) though not in its invalidating list.
OPTION_ENV_VARS = (
    "PTXAS_OPTIONS",
    "TRITON_DEBUG",
    "TRITON_INSTRUMENTATION_MODE",
    "TRITON_LIBDEVICE_PATH",
)


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def platform_tag() -> str:
    return f"{platform.machine()}-{sys.platform}"


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def triton_available() -> bool:
    return package_version("triton") is not None


def local_environment(archs: Iterable[str]) -> Environment:
    """Fingerprint this interpreter's Triton for the given target archs (imports triton)."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError as exc:
        raise MissingDependency(f"triton is not importable here ({exc}); install the serving image's triton") from None
    return Environment(
        python=python_tag(),
        platform=platform_tag(),
        triton=package_version("triton"),
        triton_key_sha256=hashlib.sha256(triton_key().encode()).hexdigest(),
        ptxas={arch: ptxas_version(arch) for arch in sorted(set(archs))},
        env_vars=key_env_vars(),
        torch=package_version("torch"),
        vllm=package_version("vllm"),
        flashinfer=package_version("flashinfer-python"),
    )


def ptxas_version(arch: str) -> str:
    """The ``ptxas --version`` text Triton's CUDA backend hashes for this arch."""
    from triton.backends.nvidia.compiler import get_ptxas_version

    return get_ptxas_version(arch_to_capability(arch))


def key_env_vars() -> dict[str, str]:
    from triton._C.libtriton import get_cache_invalidating_env_vars

    found = dict(get_cache_invalidating_env_vars())
    found.update({k: os.environ[k] for k in OPTION_ENV_VARS if k in os.environ})
    return dict(sorted(found.items()))


@dataclass(frozen=True)
class Difference:
    field: str
    bundle: str
    local: str
    blocking: bool  # False: recorded for the reader, not part of any cache key
    why: str = ""


def compare(manifest: Manifest, local: Environment) -> list[Difference]:
    """Every field that differs between the bundle's environment and this one."""
    b, here = manifest.environment, local
    diffs: list[Difference] = []

    def check(name: str, want: object, have: object, blocking: bool = True, why: str = "") -> None:
        if want != have:
            diffs.append(Difference(name, _show(want), _show(have), blocking, why))

    check("python", b.python, here.python, why="each CPython minor ships its own libtriton.so")
    check("platform", b.platform, here.platform, why="launchers are native code")
    check("triton", b.triton, here.triton)
    check("triton_key_sha256", b.triton_key_sha256, here.triton_key_sha256, why="a different Triton build")
    for arch, text in sorted(b.ptxas.items()):
        theirs = here.ptxas.get(arch)
        if text != theirs:
            want, have = _first_difference(text, theirs)
            diffs.append(Difference(f"ptxas[{arch}]", want, have, True, "ptxas --version is in backend.hash()"))
    check("env_vars", b.env_vars, here.env_vars, why="cache-invalidating variables set here differ")
    if b.vllm and here.vllm:
        check("vllm", b.vllm, here.vllm, why="kernel sources differ between vLLM releases")
    if manifest.flashinfer and here.flashinfer:
        check("flashinfer", b.flashinfer, here.flashinfer, why="FlashInfer loads modules of its own version only")
    check("torch", b.torch, here.torch, blocking=False, why="not part of any Triton cache key")
    return diffs


def compare_gpu(target: Target, gpus: list) -> list[Difference]:
    """Refuse a bundle whose arch (or, when it was built per GPU model, SM count) is not the GPU's."""
    diffs = []
    for gpu in gpus:
        if gpu.capability != target.capability:
            diffs.append(Difference(f"gpu[{gpu.index}].arch", target.arch, gpu.arch, True, gpu.name))
        elif target.sm_count and gpu.sm_count != target.sm_count:
            diffs.append(
                Difference(
                    f"gpu[{gpu.index}].sm_count",
                    f"{target.sm_count} ({target.gpu})",
                    str(gpu.sm_count),
                    True,
                    f"{gpu.name}: split top-p kernels are keyed by SM count",
                )
            )
    return diffs


def _first_difference(a: str | None, b: str | None) -> tuple[str, str]:
    """The first line where two ``ptxas --version`` texts differ, for a readable table."""
    left, right = (a or "").splitlines(), (b or "").splitlines()
    for x, y in zip(left + [""] * len(right), right + [""] * len(left)):
        if x != y:
            return x or "(nothing)", y or "(nothing)"
    return _show(a), _show(b)


def _show(value: object) -> str:
    if value is None:
        return "(not installed)"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "(none)"
    return str(value)
