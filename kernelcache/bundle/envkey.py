"""What the environment fingerprint depends on, read without importing Triton or torch.

Computing the fingerprint (``fingerprint.local_environment``) imports Triton, hashes its 400 MB
``libtriton.so`` for ``triton_key()``, runs ``ptxas --version`` and asks libtriton for the
cache-invalidating variables: 0.5-1.5 s. An ``EnvironmentKey`` names everything that computation
reads, by path and ``stat``, so a fingerprint computed once stays valid exactly while the key is equal:

* the interpreter: ``sys.executable``, its full version and extension suffix (which pick libtriton.so);
* every file ``triton_key()`` reads (triton/runtime/cache.py): ``runtime/cache.py``, the ``.py`` files
  under ``compiler/``, ``backends/`` and ``language/``, and the shared libraries in ``_C/``;
* the ptxas binaries Triton runs for ``ptxas --version`` (``backends/nvidia/bin/`` and any
  ``TRITON_PTXAS*_PATH``), which go into ``backend.hash()``;
* every variable Triton could read into a key, with its value: all names with a prefix Triton's
  cache-invalidating list uses (``TRITON_``, ``MLIR_``, ``LLVM_``, ...) and the option variables;
* the distributions the fingerprint names (triton, torch, vllm, flashinfer-python, apache-tvm-ffi):
  the metadata directory found first on ``sys.path`` and the stat of its ``METADATA``.

A file is known by (size, mtime_ns, ctime_ns): a reinstall writes new files, and a copy that keeps
the mtime (``cp -p``, an image layer) still gets a new ctime, which cannot be set back. Only
Triton >= 3.4 is covered (ptxas from ``backends/nvidia/bin`` or ``TRITON_PTXAS*_PATH``, never PATH).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import BundleManifestError
from ..runtime.site.kernelcache_tritonkey import triton_files  # the served triton_key() seed checks these too
from .keyvars import key_candidates

if TYPE_CHECKING:  # the key itself needs no manifest: a no-op install computes it before anything else
    from .manifest import Environment

DISTRIBUTIONS = ("triton", "torch", "vllm", "flashinfer-python", "apache-tvm-ffi")

Stat = tuple[int, int, int]  # size, mtime_ns, ctime_ns


@dataclass(frozen=True)
class EnvironmentKey:
    """What a fingerprint was computed from; equal keys mean the same fingerprint."""

    interpreter: str  # "<sys.executable> <sys.version> <extension suffix>"
    triton: dict[str, Stat] = field(default_factory=dict)  # file triton_key() reads -> stat ({}: no triton)
    ptxas: dict[str, Stat] = field(default_factory=dict)  # ptxas binary -> stat
    env: dict[str, str] = field(default_factory=dict)  # variables Triton could read into a key
    distributions: dict[str, str] = field(default_factory=dict)  # name -> "<metadata dir> <stat>" or ""

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, data: Any) -> EnvironmentKey:
        from .manifest import _build

        def stats(value: Any) -> dict[str, Stat]:
            return {str(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in dict(value).items()}

        return _build(cls, data, triton=stats, ptxas=stats, env=dict, distributions=dict)

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class KnownEnvironment:
    """A fingerprint and the key it was computed under (one file in a cache dir's state)."""

    key: EnvironmentKey
    environment: Environment

    def to_json(self) -> str:
        return json.dumps({"key": self.key.to_dict(), "environment": asdict(self.environment)}, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> KnownEnvironment:
        """``ValueError`` for anything that is not a record this module wrote."""
        from .manifest import Environment, _build

        try:
            data = json.loads(text)
            return cls(EnvironmentKey.from_dict(data["key"]),
                       _build(Environment, data["environment"], ptxas=dict, env_vars=dict))
        except (KeyError, TypeError, IndexError, BundleManifestError) as exc:
            raise ValueError(f"not a fingerprint record: {exc!r}") from None

    def covers(self, key: EnvironmentKey, archs: set[str]) -> bool:
        """Valid for ``key`` and holds the ptxas text of every arch asked for."""
        return self.key == key and archs <= set(self.environment.ptxas)


def environment_key() -> EnvironmentKey:
    """This process's key: a few hundred ``stat`` calls, no import of Triton or torch."""
    _LISTINGS.clear()  # listings are shared by one key's lookups only: pip may have run since the last key
    env = dict(os.environ)
    triton_dir = package_dir("triton")
    return EnvironmentKey(
        interpreter=f"{sys.executable} {sys.version} {importlib.machinery.EXTENSION_SUFFIXES[0]}",
        triton=_triton_files(triton_dir) if triton_dir else {},
        ptxas=_ptxas_files(triton_dir, env),
        env=key_candidates(env),
        distributions=_metadata_states(DISTRIBUTIONS),
    )


def package_dir(name: str) -> str | None:
    """Where ``import name`` would load the package from, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec else []
    return os.path.realpath(locations[0]) if locations else None


def _stat(path: str) -> Stat | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _triton_files(root: str) -> dict[str, Stat]:
    return {rel: (stat[0], stat[1], stat[2]) for rel, stat in triton_files(root).items()}


def _ptxas_files(triton_dir: str | None, env: dict[str, str]) -> dict[str, Stat]:
    paths = [env[k] for k in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH") if env.get(k)]
    if triton_dir:
        folder = os.path.join(triton_dir, "backends", "nvidia", "bin")
        paths += [os.path.join(folder, f) for f in sorted(_listdir(folder)) if f.startswith("ptxas")]
    return {p: s for p in paths if (s := _stat(p)) is not None}


_LISTINGS: dict[str, list[str]] = {}


def _listdir(path: str) -> list[str]:
    if path not in _LISTINGS:
        try:
            _LISTINGS[path] = os.listdir(path)
        except OSError:
            _LISTINGS[path] = []
    return _LISTINGS[path]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


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
        stat = next((s for f in ("METADATA", "PKG-INFO") if (s := _stat(os.path.join(folder, f)))), None) \
            if folder else None
        states[name] = f"{os.path.realpath(folder)} {stat}" if folder else ""
    return states
