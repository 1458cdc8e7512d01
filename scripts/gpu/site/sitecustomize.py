"""GPU-harness only (never shipped): serve an empty ``vllm._C_stable_libtorch``.

The H200 image has no vLLM; the harness carries vLLM 0.33.0's pure-Python tree, which has none of
its compiled extensions. ``vllm/platforms/cuda.py`` imports ``vllm._C_stable_libtorch`` at import
time although the sampler never calls into it (measured on the H200: zero attribute lookups). This
finder returns an empty module for that one name and records every attribute looked up on it.
"""

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = {"vllm._C_stable_libtorch"}
lookups = []


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        lookups.append(name)
        raise AttributeError(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in STUBBED:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        return _Stub(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubFinder())

# Chain kernelcache's own hook (compile log) when it is on the path too, but only when Python imported this file as
# `sitecustomize`: kernelcache's sitecustomize runs the one it shadows (this one) itself, and chaining back from
# there would run the two in turn until the recursion limit.
import importlib.util  # noqa: E402
import os  # noqa: E402

_here = os.path.dirname(os.path.abspath(__file__))
if getattr(sys.modules.get("sitecustomize"), "__dict__", None) is globals():
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path
                                                                      if os.path.abspath(p or ".") != _here])
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
