"""This environment as files and variables, read with the standard library alone (no dataclasses, pathlib or
subprocess: a no-op install on every pod start imports this module and little else).

* the variables Triton could read into a cache key (``key_candidates``);
* the environment key's contents (``scan_key``; envkey.py wraps them in ``EnvironmentKey``) and its digest;
* where a package and a distribution's metadata are, and a distribution's version, without importing them;
* a witness of the GPUs a new process would see (``gpu_witness``), read without CUDA.
"""

from __future__ import annotations

import os
import sys
from _imp import extension_suffixes  # importlib.machinery.EXTENSION_SUFFIXES is this list, without importlib

from ..hooks.kernelcache_records import json_dumps_sorted, sha256_hex, stamp
from ..hooks.kernelcache_tritonkey import triton_files  # the served triton_key() seed checks these too

DISTRIBUTIONS = ("triton", "torch", "vllm", "flashinfer-python", "apache-tvm-ffi")

Stat = tuple[int, int, int]  # size, mtime_ns, ctime_ns

# Read by Triton into CUDAOptions (and so into the key) though not in its invalidating list.
OPTION_ENV_VARS = (
    "PTXAS_OPTIONS",
    "TRITON_DEBUG",
    "TRITON_INSTRUMENTATION_MODE",
    "TRITON_LIBDEVICE_PATH",
)
# The cache-invalidating variables of Triton 3.4-3.6 all start with one of these (a test checks the list
# libtriton.so holds).
KEY_ENV_PREFIXES = ("TRITON_", "MLIR_", "LLVM_", "AMDGCN_", "NVPTX_", "DISABLE_", "ENABLE_", "USE_", "ALLOW_")
# Where caches live and who keeps them, not what they hold: `kernelcache env` sets TRITON_CACHE_DIR, a build with a
# build cache and the read-only overlay set TRITON_CACHE_MANAGER, and none of them is in a key.
NOT_IN_KEYS = ("TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_CACHE_MANAGER")


def key_candidates(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that Triton could read into a cache key, with their values."""
    return {k: v for k, v in sorted(env.items())
            if (k.startswith(KEY_ENV_PREFIXES) or k in OPTION_ENV_VARS) and k not in NOT_IN_KEYS}


def scan_key() -> dict:
    """The fields of this process's ``EnvironmentKey`` (format/envkey.py): a few hundred ``stat`` calls."""
    _LISTINGS.clear()  # listings are shared by one key's lookups only: pip may have run since the last key
    env = dict(os.environ)
    triton_dir = package_dir("triton")
    return {
        "interpreter": f"{sys.executable} {sys.version} {extension_suffixes()[0]}",
        "triton": _triton_files(triton_dir) if triton_dir else {},
        "ptxas": _ptxas_files(triton_dir, env),
        "env": key_candidates(env),
        "distributions": _metadata_states(DISTRIBUTIONS),
    }


def key_digest(fields: dict) -> str:
    """The digest of a key's fields (tuples and lists alike, as JSON writes them)."""
    return sha256_hex(json_dumps_sorted(fields).encode())


def package_dir(name: str) -> str | None:
    """Where ``import name`` would load the top-level package ``name`` from, found without importing it."""
    try:
        spec = _find_spec(name)
    except ImportError:
        return None
    locations = list(spec.submodule_search_locations or ()) if spec else []
    return os.path.realpath(locations[0]) if locations else None


def _find_spec(name: str):
    """``importlib.util.find_spec(name)`` of a top-level name, without importing importlib (every pod start's no-op
    install asks it): the module's own spec once it is imported, else the first answer of the ``sys.meta_path``
    finders, asked as importlib's ``_find_spec`` asks them."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None)
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, None) if find is not None else None
        if spec is not None:
            return spec
    return None


def _triton_files(root: str) -> dict[str, Stat]:
    return {rel: (stat[0], stat[1], stat[2]) for rel, stat in triton_files(root).items()}


def _ptxas_files(triton_dir: str | None, env: dict[str, str]) -> dict[str, Stat]:
    paths = [env[k] for k in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH") if env.get(k)]
    if triton_dir:
        folder = os.path.join(triton_dir, "backends", "nvidia", "bin")
        paths += [os.path.join(folder, f) for f in sorted(_listdir(folder)) if f.startswith("ptxas")]
    return {p: tuple(s) for p in paths if (s := stamp(p)) is not None}


_LISTINGS: dict[str, list[str]] = {}


def _listdir(path: str) -> list[str]:
    if path not in _LISTINGS:
        try:
            _LISTINGS[path] = os.listdir(path)
        except OSError:
            _LISTINGS[path] = []
    return _LISTINGS[path]


def _normalize(name: str) -> str:
    if "-" not in name and "." not in name and "__" not in name:
        return name.lower()  # no run of separators to collapse: a dist-info's name part, as wheels write it
    out: list[str] = []  # re.sub(r"[-_.]+", "_", name), without importing re (a no-op install's pod start)
    separated = False
    for char in name:
        if char in "-_.":
            if not separated:
                out.append("_")
            separated = True
        else:
            out.append(char)
            separated = False
    return "".join(out).lower()


def metadata_dirs(names: tuple[str, ...]) -> dict[str, str]:
    """The ``.dist-info`` / ``.egg-info`` dir of each distribution found first on ``sys.path``, searched
    as importlib.metadata searches (one listing per path entry); names not found are left out."""
    wanted = {_normalize(n): n for n in names}
    found: dict[str, str] = {}
    for entry in sys.path:
        folder = entry or "."
        for child in _listdir(folder):
            stem, _, suffix = child.rpartition(".")
            name = wanted.get(_normalize(stem.split("-")[0])) if suffix in ("dist-info", "egg-info") else None
            if name is not None and name not in found:
                found[name] = os.path.join(folder, child)
    return found


def distribution_version(name: str) -> str | None:
    """``importlib.metadata.version(name)`` without importing importlib.metadata (10-20 ms, on every `env` of a
    cache holding FlashInfer modules): the ``Version`` header of the metadata ``metadata_dirs`` finds."""
    folder = metadata_dirs((name,)).get(name)
    for file in ("METADATA", "PKG-INFO") if folder else ():
        try:
            with open(os.path.join(folder, file), encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if line.startswith("Version:"):
                        return line.partition(":")[2].strip()
                    if not line.strip():
                        break  # the headers end at the first blank line
        except OSError:
            continue
    return None


def _metadata_states(names: tuple[str, ...]) -> dict[str, str]:
    found = metadata_dirs(names)
    states = {}
    for name in names:
        folder = found.get(name)
        stat = next((tuple(s) for f in ("METADATA", "PKG-INFO") if (s := stamp(os.path.join(folder, f)))), None) \
            if folder else None
        states[name] = f"{os.path.realpath(folder)} {stat}" if folder else ""
    return states


# What CUDA reads to pick and order the GPUs it shows a process.
WITNESS_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "KERNELCACHE_NO_GPU_PROBE")
_NVIDIA_PROC = "/proc/driver/nvidia"


def gpu_witness() -> str:
    """A digest of what decides the GPUs ``visible_gpus()`` would report, read without CUDA in about a ms.

    It covers the NVIDIA device nodes (``/dev/nvidia*``, WSL's ``/dev/dxg``), the driver's version file and
    per-GPU information files (``/proc/driver/nvidia/gpus/*/information``: model, UUID, bus location; a
    container sees the files of its own GPUs only), the names under the driver's ``capabilities`` dir (MIG
    instances appear there) and the variables in ``WITNESS_VARIABLES``. A probe's answer stands while the
    witness is equal; a changed witness (another node, another GPU, MIG reconfigured) means probing again.
    """
    parts = [f"{name}={os.environ.get(name)}" for name in WITNESS_VARIABLES]
    try:
        devices = os.listdir("/dev")
    except OSError:
        devices = []
    parts += sorted(f"dev {n}" for n in devices if n.startswith(("nvidia", "dxg")))
    parts += [f"{path} {_read(path)}" for path in [f"{_NVIDIA_PROC}/version", *_gpu_information_files()]]
    for folder, dirs, files in os.walk(f"{_NVIDIA_PROC}/capabilities"):
        parts += sorted(f"cap {folder}/{n}" for n in [*dirs, *files])
    return sha256_hex("\n".join(parts).encode())


def _gpu_information_files() -> list[str]:
    try:
        return sorted(f"{_NVIDIA_PROC}/gpus/{bus}/information" for bus in os.listdir(f"{_NVIDIA_PROC}/gpus"))
    except OSError:
        return []


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return "(none)"
