"""Triton's cache key: the name of one cache directory, the base32 form of a compiled kernel's metadata hash
(``FileCacheManager`` in triton/runtime/cache.py names its directories by it). Harvest reads a cache dir by it,
install checks a bundle's members against it, and the compile log records it."""

from __future__ import annotations

import re

from ..hooks.kernelcache_listener import base32_key  # the compile log's hook names keys too

KEY_PATTERN = re.compile(r"[A-Z2-7]{52}")


__all__ = ["KEY_PATTERN", "base32_key"]
