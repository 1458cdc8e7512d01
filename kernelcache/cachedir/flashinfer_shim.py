"""kernelcache's stand-in for the ``flashinfer_jit_cache`` package (copied into a generated dir).

FlashInfer (``flashinfer/jit/env.py``) imports ``flashinfer_jit_cache`` if it can, accepts it when
``__version__`` is its own version (or that plus ``+<local>``), calls ``get_jit_cache_providers()``
and keeps each provider whose ``version`` equals the shim's. Providers register in the
``flashinfer.jit_cache.providers`` entry-point group; each factory returns a schema-1 mapping
(``distribution``, ``version``, ``jit_cache_dir``, ``cuda_architectures``, ``modules``). FlashInfer
then loads ``<jit_cache_dir>/<module>/<module>.so`` from the best arch-compatible provider,
without nvcc or ninja, even with ``FLASHINFER_DISABLE_JIT=1``.

This file implements that contract and nothing else. It is kernelcache's own code, used only when
the real flashinfer-jit-cache is not installed. ``__version__`` is the running FlashInfer's
version, so FlashInfer's provider check compares each provider with the FlashInfer it runs under.
No kernelcache import: it runs in the serving interpreter, maybe without kernelcache.
"""

import importlib.metadata
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP = "flashinfer.jit_cache.providers"
JIT_CACHE_PROVIDER_SCHEMA_VERSION = 1
_FIELDS = ("distribution", "version", "jit_cache_dir", "cuda_architectures", "modules")


def _flashinfer_version() -> str:
    loaded = sys.modules.get("flashinfer.version")
    if loaded is not None:
        return loaded.__version__
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0+unknown"


__version__ = _flashinfer_version()


@dataclass(frozen=True)
class JitCacheProvider:
    provider_id: str
    distribution: str
    version: str
    jit_cache_dir: Path
    cuda_architectures: frozenset
    modules: frozenset


def _arch(name: str) -> str:
    """``sm_90a`` / ``sm90a`` / ``90a`` -> ``sm90a``."""
    text = str(name).strip().lower().removeprefix("sm_").removeprefix("sm")
    if not re.fullmatch(r"\d{2,3}[af]?", text):
        raise ValueError(f"not a CUDA architecture: {name!r}")
    return f"sm{text}"


def _provider(provider_id: str, data) -> JitCacheProvider:
    if not hasattr(data, "get") or data.get("schema_version") != JIT_CACHE_PROVIDER_SCHEMA_VERSION:
        raise ValueError(f"expected a schema {JIT_CACHE_PROVIDER_SCHEMA_VERSION} mapping")
    missing = [name for name in _FIELDS if name not in data]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    archs = frozenset(_arch(a) for a in data["cuda_architectures"])
    modules = frozenset(str(m) for m in data["modules"])
    if not archs or not modules:
        raise ValueError("no architectures or no modules")
    return JitCacheProvider(provider_id, str(data["distribution"]), str(data["version"]),
                            Path(str(data["jit_cache_dir"])).resolve(), archs, modules)


def get_jit_cache_providers() -> tuple:
    """Every valid provider registered in the entry-point group, sorted by id."""
    found = []
    for entry in importlib.metadata.entry_points(group=JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP):
        try:
            found.append(_provider(entry.name, entry.load()()))
        except Exception as error:  # noqa: BLE001 -- a broken provider is skipped, like FlashInfer's own shim
            logger.warning("Ignoring invalid flashinfer jit-cache provider %s: %s", entry.name, error)
    return tuple(sorted(found, key=lambda p: p.provider_id))
