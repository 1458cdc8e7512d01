"""kernelcache's process hook, put on PYTHONPATH by ``kernelcache env/run --read-only`` and ``capture``.

* Overlay (``KERNELCACHE_MISS_LOG`` set and the overlay manager selected): when ``triton.knobs`` is
  first imported, ``knobs.compilation.listener`` is pointed at ``kernelcache_overlay.on_compile``
  (imported only when a compile happens), which gives the miss log each missed kernel's specialization.
* Triton key (``KERNELCACHE_TRITON_KEYS`` set, as ``env`` / ``run`` do for a cache that keeps one): once
  ``triton.runtime.cache`` is imported, ``triton_key()`` returns the value the install computed while
  Triton's files are unchanged, instead of hashing libtriton.so again (``kernelcache_tritonkey``); and once
  Triton's knobs, nvidia compiler and driver modules are imported, their ``ptxas --version`` and
  ``ldconfig -p`` runs, and once its build module is, ``platform.architecture()``'s ``file`` run, return what the
  install recorded while the files behind them hold (``kernelcache_outputs``).
* Compile log (``KERNELCACHE_COMPILE_LOG`` set, as ``capture`` does): once ``triton`` is imported,
  every compile() (hit or miss) and every gcc build of a Triton helper module is appended to the log.
* Autotune choices (``KERNELCACHE_AUTOTUNE_CHECK=1``, as ``env`` / ``run`` set it beside
  ``TRITON_CACHE_AUTOTUNING=1`` where an installed bundle carries choices): once Triton's autotuner is imported,
  an autotune file it could not use is timed again instead of failing the launch (``kernelcache_autotune``).

* Debug log (``KERNELCACHE_DEBUG`` set): one line on stderr for the hooks this process got, then one per kept
  record used or refused, with the reason (kernelcache_tritonkey.say).

Nothing here imports Triton early; processes that never import it are untouched. Any
``sitecustomize`` this one shadows on ``sys.path`` still runs, first; one that chains to the next
``sitecustomize`` on the path in turn (and so back to this one) finds this one already running, and
everything here happens once.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

from kernelcache_tritonkey import AfterImport, debugging, say, seed_on_import  # this directory: standard library only

KERNELCACHE_OVERLAY_LISTENER = False  # True once Triton's listener points here (kernelcache_overlay checks)
_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_shadowed_sitecustomize() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _listener(**kwargs) -> None:
    import kernelcache_overlay

    kernelcache_overlay.on_compile(**kwargs)


def _attach(knobs) -> None:
    global KERNELCACHE_OVERLAY_LISTENER
    previous = knobs.compilation.listener

    def listener(**kwargs):
        _listener(**kwargs)
        if previous is not None:
            previous(**kwargs)

    knobs.compilation.listener = listener
    KERNELCACHE_OVERLAY_LISTENER = True


def _record_compiles(triton) -> None:
    """Every compile() and gcc build of this process into KERNELCACHE_COMPILE_LOG."""
    import kernelcache_listener

    kernelcache_listener.install()
    kernelcache_listener.count_builds()


_RUNNING = "_kernelcache_sitecustomize"  # set on sys while this runs: a copy of this file loaded again does nothing


def _once() -> bool:
    if getattr(sys, _RUNNING, False):
        return False
    setattr(sys, _RUNNING, True)
    return True


def _say_hooks() -> None:
    """Under KERNELCACHE_DEBUG: which hooks this process got, and the Triton cache it is pointed at."""
    keys = os.environ.get("KERNELCACHE_TRITON_KEYS")
    say("served process", f"TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR', '(unset)')}",
        f"kept records from {keys}" if keys else "KERNELCACHE_TRITON_KEYS unset: no kept record is used")


def _hooks() -> None:
    if os.environ.get("KERNELCACHE_MISS_LOG") and "kernelcache_overlay" in os.environ.get("TRITON_CACHE_MANAGER", ""):
        sys.meta_path.insert(0, AfterImport("triton.knobs", _attach))
    if os.environ.get("KERNELCACHE_TRITON_KEYS"):
        seed_on_import(os.environ["KERNELCACHE_TRITON_KEYS"])
    if os.environ.get("KERNELCACHE_COMPILE_LOG"):
        sys.meta_path.insert(0, AfterImport("triton", _record_compiles))
    if os.environ.get("KERNELCACHE_AUTOTUNE_CHECK") == "1":
        import kernelcache_autotune

        kernelcache_autotune.guard_on_import()
    if debugging():
        _say_hooks()


if _once():
    try:
        _run_shadowed_sitecustomize()
    finally:
        _hooks()
