"""Record every Triton ``compile()`` call -- disk hit or real compile -- as one JSON line.

``triton.knobs.compilation.listener`` is called on every compile, hit or miss, with the source
(signature, constexprs, attrs), the metadata (hash, num_warps, ...) and ``cache_hit``
(``compile`` in triton/compiler/compiler.py). Triton's own metadata file keeps no signature or
constexprs, so this log is where the bundle manifest gets them, where ``verify`` counts compiles,
and where the overlay's miss log comes from. The log's records, its appender and its readers are the ground
floor's (format/compilelog.py); this module hooks Triton to write them.
"""

from __future__ import annotations

from ..format.cachekey import base32_key
from ..format.compilelog import LOG_ENV, CompileRecord, ExerciseLog, append, compiles, read
from ..hooks.kernelcache_listener import count_builds, event, install

# The Triton hook is the served process's (hooks/kernelcache_listener.py: capture's processes install it from the
# site dir), the compile log's records and readers the ground floor's (format/compilelog.py); their old names stay.
__all__ = ["LOG_ENV", "CompileRecord", "ExerciseLog", "append", "base32_key", "compiles", "count_builds", "event",
           "install", "read"]
