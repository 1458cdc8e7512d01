"""The environment fingerprint: what must be equal on both sides for a bundle to hit.

Triton's cache key is ``triton_key()-src.hash()-backend.hash()-options.hash()-env_vars``
(``compile`` in triton/compiler/compiler.py). ``triton_key()`` changes with the wheel (and with the Python
minor, which picks ``libtriton.so``), ``backend.hash()`` is the ptxas ``--version`` text plus the
arch, ``options`` take ``PTXAS_OPTIONS`` and a few knobs from the environment, and the env-var part
is the set of cache-invalidating variables that are *set* (even to their default). The kernel
sources come from vLLM, so its version is pinned too. torch is recorded but is not in the key.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import MissingDependency
from .envscan import OPTION_ENV_VARS
from .manifest import DeviceKeys, Environment, Manifest, Target, Tuning, arch_to_capability, capability_of


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def platform_tag() -> str:
    return f"{platform.machine()}-{sys.platform}"


def package_version(name: str) -> str | None:
    import importlib.metadata  # 10-20 ms of imports: only where a version is asked for

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


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
    """The ``ptxas --version`` text Triton's CUDA backend hashes for this arch.

    Triton 3.6 picks a ptxas per arch (``get_ptxas_version(arch)``: ptxas-blackwell from sm_100);
    3.4 and 3.5 have one ptxas and take no argument."""
    import inspect

    from triton.backends.nvidia.compiler import get_ptxas_version

    if inspect.signature(get_ptxas_version).parameters:
        return get_ptxas_version(arch_to_capability(arch))
    return get_ptxas_version()


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


_HERE = "here"


def compare(manifest: Manifest, local: Environment, triton: bool | None = None,
            tvm_ffi: str | None = _HERE) -> list[Difference]:
    """Every field that differs between the bundle's environment and ``local`` (this one, by default).

    ``triton``: whether the bundle holds Triton entries (default: read from the manifest; a planned
    bundle has none yet). ``tvm_ffi``: the apache-tvm-ffi version on the local side (default: here).
    """
    b, here = manifest.environment, local
    has_triton = bool(manifest.kernels or manifest.modules) if triton is None else triton
    diffs: list[Difference] = []

    def check(name: str, want: object, have: object, blocking: bool = True, why: str = "") -> None:
        if want != have:
            diffs.append(Difference(name, _show(want), _show(have), blocking, why))

    check("platform", b.platform, here.platform, why="launchers and FlashInfer modules are native code")
    if has_triton:  # a FlashInfer-only bundle does not depend on Triton
        check("python", b.python, here.python, why="each CPython minor ships its own libtriton.so")
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
    if manifest.flashinfer:  # only then is the local apache-tvm-ffi looked up (importlib.metadata is slow)
        local_tvm_ffi = package_version("apache-tvm-ffi") if tvm_ffi == _HERE else tvm_ffi
        diffs += compare_flashinfer(manifest, here.flashinfer, here.torch, local_tvm_ffi)
    check("torch", b.torch, here.torch, blocking=False, why="not part of any Triton cache key")
    return diffs


def compare_flashinfer(manifest: Manifest, flashinfer: str | None, torch: str | None,
                       tvm_ffi: str | None) -> list[Difference]:
    """What FlashInfer does not check before loading a bundled module, against the versions here.

    Its provider lookup checks the FlashInfer version and the GPU arch at run time; it does not
    check the CUDA major (the module needs ``libcudart.so.<major>``, which torch brings), the tvm-ffi
    C ABI it links against, or that the module suits the bundle's target. A version mismatch is
    refused here too, at install, rather than as a failed load in every worker.
    """
    diffs = []
    torch_cuda = _torch_cuda_major(torch)
    for m in manifest.flashinfer:
        name = f"flashinfer[{m.name}]"
        if flashinfer is None:
            diffs.append(Difference(name, m.version, _show(None), False, "nothing here would load this module"))
            continue
        if m.version != flashinfer:
            diffs.append(Difference(name, m.version, flashinfer, True,
                                    "FlashInfer loads modules of its own version only"))
        if manifest.target.capability not in {capability_of(a) for a in m.archs}:
            diffs.append(Difference(f"{name}.archs", " ".join(m.archs), manifest.target.arch, True,
                                    "the module has no code for the bundle's target"))
        major = m.cuda.split(".")[0]
        if torch_cuda is not None and major != torch_cuda:
            diffs.append(Difference(f"{name}.cuda", m.cuda, f"torch {torch}", True,
                                    f"the module needs libcudart.so.{major}, this torch ships CUDA {torch_cuda}"))
        if m.sources_sha256 and m.version == flashinfer:
            diffs += _sources_changed(m, name)
        if m.tvm_ffi and tvm_ffi and m.tvm_ffi != tvm_ffi:
            same_minor = m.tvm_ffi.split(".")[:2] == tvm_ffi.split(".")[:2]
            diffs.append(Difference(f"{name}.tvm_ffi", m.tvm_ffi, tvm_ffi, not same_minor,
                                    "the module links against apache-tvm-ffi's C ABI"))
    return diffs


def _sources_changed(module, name: str) -> list[Difference]:
    """A module whose sources in the installed flashinfer package are not the ones it was built from (a patched or
    rebuilt FlashInfer of the same version): FlashInfer would load it for code it no longer has."""
    root = _flashinfer_parent()
    if root is None:
        return []
    here = flashinfer_sources_digest(module.sources, root)
    if here == module.sources_sha256:
        return []
    return [Difference(f"{name}.sources", module.sources_sha256[:16], here[:16], True,
                       "the installed FlashInfer's sources of this module differ from those it was built from")]


def _torch_cuda_major(torch: str | None) -> str | None:
    """"13" for torch "2.11.0+cu130" (the wheel's local tag); None when the version does not say."""
    local = (torch or "").partition("+")[2]
    if not (local.startswith("cu") and local[2:].isdigit() and len(local) >= 4):
        return None
    return local[2:-1]


def compare_gpu(target: Target, gpus: list, keys: DeviceKeys | None = None) -> list[Difference]:
    """Refuse a bundle whose arch (or, when it was built per GPU model, SM count) is not the GPU's, and one whose
    kernels the device name decided (``keys``: ``Manifest.device_keys``) on a GPU they do not serve."""
    diffs = []
    for gpu in gpus:
        if gpu.capability != target.capability:
            diffs.append(Difference(f"gpu[{gpu.index}].arch", target.arch, gpu.arch, True, gpu.name))
        elif keys is not None and not keys.accepts(gpu.name):
            diffs.append(Difference(f"gpu[{gpu.index}].device", f"{keys.device} ({target.gpu})", gpu.name, True,
                                    device_note(keys)))
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


def choices_refusal(tuning: Tuning | None, gpus: list) -> str | None:
    """Why a bundle's autotune choices must not be installed where ``gpus`` are visible: they were timed on another
    product, whose timings pick configs for its own clocks, memory and SM layout (Triton's key for them names the
    arch, not the product). None when there are none, no GPU is visible to tell, or every GPU is that product."""
    if tuning is None:
        return None
    other = sorted({g.name for g in gpus if g.name != tuning.product})
    if not other:
        return None
    return (f"autotune choices skipped: timed on {tuning.product}, this GPU is {other[0]}; the kernels are "
            "installed and Triton times the autotuned ones at first launch")


def device_note(keys: DeviceKeys) -> str:
    """Why a device-keyed bundle is refused on another product: which paths, and which products it serves."""
    paths = ", ".join(sorted({t.path for t in keys.tables})) or "moe/mamba"
    return f"{paths}: vLLM picks the kernels' configs by device name; this bundle serves {', '.join(keys.serves)}"


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


def flashinfer_sources_digest(sources: tuple[str, ...], root: Path) -> str:
    """sha256 over each source's path (relative to ``root``, the flashinfer package's parent) and the sha256 of its
    bytes, in order; a file that cannot be read counts as absent. A bundled FlashInfer module records it
    at build time (exercise/vllm_flashinfer.py); install computes it again over the FlashInfer it finds."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.encode() + b"\0")
        try:
            digest.update(hashlib.sha256((root / source).read_bytes()).digest())
        except OSError:
            digest.update(b"absent")
    return digest.hexdigest()


def _flashinfer_parent() -> Path | None:
    """The directory holding the installed ``flashinfer`` package, found without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent
