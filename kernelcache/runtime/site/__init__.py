"""The old name of ``kernelcache.hooks``: the hooks of a served process stand on the ground floor, and each module
keeps its old name here (``kernelcache.runtime.site.kernelcache_tritonkey`` is
``kernelcache.hooks.kernelcache_tritonkey``), as an import and as an attribute. The site dir a served process puts
on PYTHONPATH is kernelcache/hooks/."""

from importlib import import_module
from types import ModuleType

MOVED = ("kernelcache_autotune", "kernelcache_outputs", "kernelcache_overlay", "kernelcache_prebuilt",
         "kernelcache_tritonkey", "kernelcache_walks")


def __getattr__(name: str) -> ModuleType:
    if name in MOVED:
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
