"""kernelcache: prebuilt Triton and FlashInfer kernel caches for LLM-serving cold starts.

The Python API has the CLI's verbs. Importing this package imports neither torch nor triton;
each verb imports what it needs when called.

    import kernelcache
    kernelcache.activate(bundle="/bundles/vllm-sampler-sm_90-h200.tar.zst")   # before importing vllm
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_API = {
    "pack": "kernelcache.bundle.make:pack",
    "inspect": "kernelcache.bundle.inspect:inspect",
    "install": "kernelcache.install:install",
    "plan_install": "kernelcache.install:plan_install",
    "env": "kernelcache.runtime.env:environment",
    "activate": "kernelcache.runtime.env:activate",
    "run": "kernelcache.runtime.env:run",
    "build": "kernelcache.build:build",
    "capture": "kernelcache.capture:capture",
    "verify": "kernelcache.verify:verify",
    "diff": "kernelcache.bundle.compare:diff",
    "merge": "kernelcache.bundle.compare:merge",
    "push": "kernelcache.remote.oci:push",
    "pull": "kernelcache.remote:pull",
    "fetch": "kernelcache.remote:fetch",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    target = _API.get(name)
    if target is None:
        raise AttributeError(f"module 'kernelcache' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr)
