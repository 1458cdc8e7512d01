"""kernelcache's process hook, put on PYTHONPATH by `kernelcache capture` and `verify`.

When KERNELCACHE_COMPILE_LOG is set, every Triton compile() of this process (hit or miss) and every
gcc build of a Triton helper module is appended to that log, from the moment Triton is imported.
Nothing happens in processes that never import Triton. Another sitecustomize further down
sys.path still runs.
"""

import importlib.abc
import importlib.util
import os
import sys


class _AfterTritonImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "triton":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("triton")
        if spec is None or spec.loader is None:
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            from kernelcache.exercise import listener

            listener.install()
            listener.count_builds()

        spec.loader.exec_module = exec_module
        return spec


def _chain_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("KERNELCACHE_COMPILE_LOG"):
    sys.meta_path.insert(0, _AfterTritonImport())
_chain_next_sitecustomize()
