"""Triton's cache key: the name of one cache directory, the base32 form of a compiled kernel's metadata hash
(``FileCacheManager`` in triton/runtime/cache.py names its directories by it). Harvest reads a cache dir by it,
install checks a bundle's members against it, and the compile log records it."""

from __future__ import annotations

import re

KEY_PATTERN = re.compile(r"[A-Z2-7]{52}")


def base32_key(hash_hex: str) -> str:
    """The cache directory name Triton derives from a metadata hash."""
    import base64

    return base64.b32encode(bytes.fromhex(hash_hex)).decode().rstrip("=")
