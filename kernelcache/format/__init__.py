"""The ground floor: the bundle format and the vocabulary every stage reads -- the manifest and its canonical JSON,
the archive's reading and writing rules, the environment fingerprint, key and scan, the Triton identity record, the
cache-key pattern and the compile-log records. It imports no stage: only kernelcache.errors and the hooks of a served
process (hooks/, standard library only)."""

import sys


def keep_old_name(name: str) -> None:
    """Module ``name`` of this package answers to its name before the move too (``kernelcache.bundle.<module>``),
    in ``sys.modules``: whoever looks a module up by that name finds the one module object."""
    sys.modules.setdefault("kernelcache.bundle." + name.rpartition(".")[2], sys.modules[name])
