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

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import BundleManifestError
from .envscan import Stat, key_digest, scan_key

if TYPE_CHECKING:  # the key itself needs no manifest: a no-op install computes it before anything else
    from .manifest import Environment


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
        return key_digest(self.to_dict())


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
    return EnvironmentKey(**scan_key())
