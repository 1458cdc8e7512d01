"""The environment variables Triton could read into a cache key (standard library only).

Kept apart from fingerprint.py so that the environment key (envkey.py), which a no-op install computes on
every pod start, needs neither the manifest's dataclasses nor Triton.
"""

from __future__ import annotations

# Read by Triton into CUDAOptions (and so into the key) though not in its invalidating list.
OPTION_ENV_VARS = (
    "PTXAS_OPTIONS",
    "TRITON_DEBUG",
    "TRITON_INSTRUMENTATION_MODE",
    "TRITON_LIBDEVICE_PATH",
)
# The cache-invalidating variables of Triton 3.4-3.6 all start with one of these (a test checks the list
# libtriton.so holds).
KEY_ENV_PREFIXES = ("TRITON_", "MLIR_", "LLVM_", "AMDGCN_", "NVPTX_", "DISABLE_", "ENABLE_", "USE_", "ALLOW_")
# Where caches live, not what they hold: `kernelcache env` sets TRITON_CACHE_DIR, and neither is in a key.
NOT_IN_KEYS = ("TRITON_CACHE_DIR", "TRITON_HOME")


def key_candidates(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that Triton could read into a cache key, with their values."""
    return {k: v for k, v in sorted(env.items())
            if (k.startswith(KEY_ENV_PREFIXES) or k in OPTION_ENV_VARS) and k not in NOT_IN_KEYS}
