"""Compute Triton's ``triton_key()`` in a background thread while the serving process imports.

Every process pays ``triton_key()`` once, at its first ``compile()`` call, cache hits included: it
hashes ``libtriton.so`` (~400 MB) and Triton's Python sources, about 0.35-0.5 s (triton-cache.md).
vLLM spends seconds importing before its first kernel, so hashing during the import takes that cost
off the first request. ``triton_key`` is an ``lru_cache``: the first completed call is the one used,
and a concurrent second call would compute the same string.
"""

from __future__ import annotations

import threading

_started: threading.Thread | None = None


def start() -> threading.Thread | None:
    """Start hashing now (idempotent). Returns the thread, or None when Triton is not installed."""
    global _started
    if _started is not None:
        return _started
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return None
    _started = threading.Thread(target=_compute, name="kernelcache-triton-key", daemon=True)
    _started.start()
    return _started


def _compute() -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception:  # noqa: BLE001 -- a failed prewarm only means the first compile pays it
        pass
