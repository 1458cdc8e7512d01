"""Triton's gcc step answered from the installed cache, for a helper module built from the very same source.

Triton builds C helper modules with gcc (``cuda_utils``; up to 3.6 also a ``__triton_launcher`` per kernel
signature) and caches each under a key (https://github.com/triton-lang/triton/blob/main/python/triton/runtime/
build.py). Two parts of those keys are not the source and change nothing in the binary, yet differ between
the machine that built a bundle and the one that serves it:
* ``platform_key()`` holds CPython's ``platform.architecture()``, which asks ``file -b <python>``: its linkage
  is ``'ELF'`` where file(1) is installed and ``''`` where it is not (slim serving images);
* from Triton 3.7 the key of ``cuda_utils`` also hashes its include and library dirs: the Triton install path
  and libcuda's dir, so every machine misses it and builds it once.
On such a miss Triton calls ``triton.runtime.build._build(name, src, srcdir, ...)``, which compiles ``src``
into ``srcdir/<name><EXT_SUFFIX>``, then writes that file under the key it computed and loads it. ``seed``
wraps that function: when the installed cache holds a module of that name built from a byte-identical source,
it copies that file to where gcc would have written it, and Triton goes on as after a build. The same source
is found
* under the key Triton 3.6 gives the same source with the other linkage (``sha256(src + platform_key)``, in
  base32 as ``get_cache_manager`` names dirs);
* by the ``<name>.source-sha256`` file a bundle carries beside each ``cuda_utils`` (the sha256 of the
  ``driver.c`` it was built from, which ``triton_key()`` does not hash).
Anything else (another source, a ``knobs.build.impl`` of the user's, no such file) is built as Triton would.
``SERVED`` lists the files copied, so a build counter can tell a copy from a gcc build. Standard library only.
"""

from __future__ import annotations

import os
import sys

SOURCE_SUFFIX = ".source-sha256"
MODULE = "triton.runtime.build"
SERVED: set[str] = set()  # the build outputs this process copied from the cache instead of building


def seed(module, folder: str) -> None:
    """Wrap ``module._build`` (``triton.runtime.build``) for the installed cache whose kept Triton keys are in
    ``folder`` (``<cache>/.kernelcache/triton-keys``)."""
    activate(module, os.path.dirname(os.path.dirname(os.path.abspath(folder))))


def activate(module, root: str) -> None:
    """Wrap ``module._build`` to copy matching modules from the cache at ``root`` (once per root)."""
    original = module._build
    if getattr(original, "kernelcache_prebuilt_root", None) == root:
        return
    finder = Finder(root)

    def _build(name, src, srcdir, *args, **kwargs):
        knobs = getattr(module, "knobs", None)
        own = getattr(getattr(knobs, "build", None), "impl", None)
        found = None if own else finder.find(name, src)
        if found is None:
            _say(name, "not taken from the cache, Triton builds it",
                 "knobs.build.impl is set" if own else f"no module built from this source in {root}")
            return original(name, src, srcdir, *args, **kwargs)
        _say(name, "taken from the cache instead of a gcc build", found)
        return _copy(found, srcdir, name)

    _build.kernelcache_prebuilt_root = root
    _build.__wrapped__ = original
    module._build = _build


class Finder:
    """The cache's module file named ``name`` built from the source at a path, if there is one."""

    def __init__(self, root: str):
        self.root = root
        self._recorded: dict[str, dict[str, str]] | None = None  # name -> source sha256 -> key dir

    def find(self, name: str, src: str) -> str | None:
        import hashlib

        try:
            with open(src, "rb") as handle:
                source = handle.read()
        except OSError:
            return None
        file = name + suffix()
        for key in (_dir_name(hashlib.sha256(source + variant.encode()).digest()) for variant in platform_keys()):
            if os.path.isfile(os.path.join(self.root, key, file)):
                return os.path.join(self.root, key, file)
        # Only then the recorded sources: reading them lists every entry of the cache.
        recorded = self.recorded().get(name, {}).get(hashlib.sha256(source).hexdigest())
        if recorded and os.path.isfile(os.path.join(self.root, recorded, file)):
            return os.path.join(self.root, recorded, file)
        return None

    def recorded(self) -> dict[str, dict[str, str]]:
        """Every ``<key>/<name>.source-sha256`` under the root, read once."""
        if self._recorded is None:
            self._recorded = {}
            try:
                entries = [e.path for e in os.scandir(self.root) if e.is_dir() and not e.name.startswith(".")]
            except OSError:
                entries = []
            for entry in entries:
                for name, digest in _source_records(entry):
                    self._recorded.setdefault(name, {})[digest] = os.path.basename(entry)
        return self._recorded


def _source_records(entry: str):
    try:
        names = [n for n in os.listdir(entry) if n.endswith(SOURCE_SUFFIX)]
    except OSError:
        return
    for name in names:
        try:
            with open(os.path.join(entry, name), encoding="ascii") as handle:
                digest = handle.read().strip()
        except (OSError, ValueError):
            continue
        if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
            yield name[: -len(SOURCE_SUFFIX)], digest


def platform_keys() -> list[str]:
    """Triton's ``platform_key()`` as this interpreter gives it with file(1) installed and without: machine,
    system, then ``platform.architecture()``'s bits and linkage (``'ELF'`` from file's answer, else ``''``)."""
    import platform
    import struct

    bits = f"{struct.calcsize('P') * 8}bit"
    return [",".join([platform.machine(), platform.system(), bits, linkage]) for linkage in ("ELF", "")]


def _dir_name(digest: bytes) -> str:
    """The cache dir of a key, as ``get_cache_manager`` names it: base32 of the sha256, unpadded."""
    import base64

    return base64.b32encode(digest).decode().rstrip("=")


def suffix() -> str:
    """What Triton names a module file after its name: the interpreter's extension suffix."""
    import sysconfig

    return sysconfig.get_config_var("EXT_SUFFIX")


def _copy(found: str, srcdir: str, name: str) -> str:
    import shutil

    target = os.path.join(srcdir, name + suffix())
    shutil.copyfile(found, target)
    SERVED.add(target)
    return target


def _say(name: str, outcome: str, why: str) -> None:
    try:
        from . import kernelcache_tritonkey  # imported as kernelcache.hooks.kernelcache_prebuilt
    except ImportError:
        import kernelcache_tritonkey  # imported from the served site dir
    kernelcache_tritonkey.say(f"helper module {name}", outcome, why)


def served_by_cache(path: str) -> bool:
    """Whether this process copied ``path`` from the cache (under either name this module is imported by)."""
    names = ("kernelcache_prebuilt", "kernelcache.hooks.kernelcache_prebuilt")
    return any(path in getattr(sys.modules.get(n), "SERVED", ()) for n in names)
