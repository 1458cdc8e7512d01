"""kernelcache: prebuilt Triton and FlashInfer kernel caches for LLM-serving cold starts.

The Python API has the CLI's verbs, and returns what the CLI renders (every result has ``to_dict()``).
Importing this package imports neither torch nor triton; each verb imports what it needs when called.

    import kernelcache
    kernelcache.activate(bundle="/bundles/vllm-sampler-sm_90-h200.tar.zst")   # before importing vllm
    kernelcache.install("oci://registry.example/kernels:vllm-0.33", cache_dir="/caches/triton")
    eval_me = kernelcache.env(read_only=True, base="/caches/triton").exports()
"""

from __future__ import annotations

import sys

from .version import __version__

TYPE_CHECKING = False  # typing itself is not imported: the pod-start fast path (entry.py) pays each import

_API = {
    "pack": "kernelcache.bundle.make:pack",
    "inspect": "kernelcache.bundle.inspect:inspect",
    "install": "kernelcache.install:install",
    "plan_install": "kernelcache.install:plan_install",
    "env": "kernelcache.runtime.env:env",
    "activate": "kernelcache.runtime.env:activate",
    "run": "kernelcache.runtime.env:run",
    "build": "kernelcache.build:build",
    "capture": "kernelcache.capture:capture",
    "verify": "kernelcache.verify:verify",
    "tune": "kernelcache.tune:tune",
    "diff": "kernelcache.bundle.compare:diff",
    "merge": "kernelcache.bundle.compare:merge",
    "push": "kernelcache.remote.oci:push",
    "pull": "kernelcache.remote:pull",
    "fetch": "kernelcache.remote:fetch",
    "ls": "kernelcache.manage:ls",
    "rm": "kernelcache.manage:rm",
    "prune": "kernelcache.manage:prune",
    "recipes": "kernelcache.plan.catalog:recipes",
    "sign": "kernelcache.bundle.signature:sign",
    "signature_info": "kernelcache.bundle.signature:signature_info",
    "ls_build_cache": "kernelcache.manage:ls_build_cache",
    "prune_build_cache": "kernelcache.manage:prune_build_cache",
}

__all__ = ["__version__", "activate", "build", "capture", "diff", "env", "fetch", "inspect", "install", "ls",
           "ls_build_cache", "merge", "pack", "plan_install", "prune", "prune_build_cache", "pull", "push", "recipes",
           "rm", "run", "sign", "signature_info", "tune", "verify"]

if TYPE_CHECKING:  # type checkers and IDEs see the verbs; at run time they load on first use
    from typing import Any

    from .build import build
    from .bundle.compare import diff, merge
    from .bundle.inspect import inspect
    from .bundle.make import pack
    from .bundle.signature import sign, signature_info
    from .capture import capture
    from .install import install, plan_install
    from .manage import ls, ls_build_cache, prune, prune_build_cache, rm
    from .plan.catalog import recipes
    from .remote import fetch, pull
    from .remote.oci import push
    from .runtime.env import activate, env, run
    from .tune import tune
    from .verify import verify


_ModuleType = type(sys)  # types.ModuleType, without importing types: every pod start imports this package


class _Package(_ModuleType):
    """``build``, ``install``, ``capture``, ``tune`` and ``verify`` name both a verb and the module that holds it.
    Importing such a module makes Python bind the module to the package's attribute; refused here, so
    ``kernelcache.verify`` stays the verb however often it is called and whatever was imported before
    (``from kernelcache.verify import ...`` still reaches the module)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _API and isinstance(value, _ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    target = _API.get(name)
    if target is None:
        raise AttributeError(f"module 'kernelcache' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    from importlib import import_module  # here: importlib costs every pod start (entry.py) its import

    return getattr(import_module(module), attr)


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
