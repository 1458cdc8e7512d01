"""The ``kernelcache`` command: a thin click layer over the Python API of the same verbs.

Each command parses its options, calls one API function, and renders the result. The group (app.py) turns the
errors the API raises on purpose (``KernelcacheError``) into one line on stderr and their own exit code. The verbs,
by group: building.py (build, verify, capture, pack, tune, fingerprint, gpus, recipes), bundles.py (inspect, sign,
push, pull, diff, merge), serving.py (install, env, run), managing.py (ls, rm, prune).
"""

from . import building, bundles, managing, serving  # noqa: F401  each adds its verbs to the group
from .app import fail, main

__all__ = ["fail", "main"]
