"""Making and reading bundles: pack, inspect, diff and merge, sign, the target environment of a cross build.

The format itself lives on the ground floor (``kernelcache.format``); its modules keep their old names here
(``kernelcache.bundle.manifest`` is ``kernelcache.format.manifest``), as imports and as attributes."""

from importlib import import_module
from types import ModuleType

MOVED = ("archive", "canonical", "envkey", "envscan", "fingerprint", "identity", "manifest", "overlap")


def __getattr__(name: str) -> ModuleType:
    if name in MOVED:
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
