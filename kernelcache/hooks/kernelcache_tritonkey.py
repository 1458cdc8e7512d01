"""Triton's ``triton_key()`` for a served process, from a record the install kept, when nothing changed.

``triton_key()`` (https://github.com/triton-lang/triton/blob/main/python/triton/runtime/cache.py) hashes
every file of Triton's compiler, ``libtriton.so`` (about 400 MB) included: 0.35-0.5 s on the first compile
or cache lookup of every process, a bundle's hits included. ``kernelcache install`` computes it anyway (the
fingerprint compares it with the bundle's), so it keeps the value in ``<cache>/.kernelcache/triton-keys/``
with the (size, mtime_ns, ctime_ns) of every file the computation reads. ``kernelcache env`` / ``run`` set
``KERNELCACHE_TRITON_KEYS`` to that folder and put this directory on PYTHONPATH; ``sitecustomize`` then
calls ``seed`` right after ``triton.runtime.cache`` is imported, before any other module binds the name.

The replacement returns the kept value only when the record names this Triton directory and extension
suffix and the files the computation reads are the same files, and no others, as when it was kept:
* first by their stat, as it was then (a reinstall writes new files; a copy that keeps mtimes still gets a
  new ctime): a few stat calls;
* else by their contents (``identity``): a container image baked with the install and unpacked on another
  node keeps every byte but not the ctimes. Sources are hashed (about 0.6 MB, a few ms); a shared library
  is known by its size and its GNU build ID, which the linker derives from the library's contents
  (``ld --build-id``; libtriton.so carries one), so the 400 MB are not read. A match rewrites the record's
  stats when the folder is writable, so the next process takes the first check.
Otherwise it computes the key as Triton does. Standard library only: this runs inside the served
interpreter, before anything else.
"""

from __future__ import annotations

import os
import sys

try:
    from . import kernelcache_records  # imported as kernelcache.hooks.kernelcache_tritonkey
except ImportError:
    import kernelcache_records  # imported from the served site dir

stamp = kernelcache_records.stamp  # the sibling modules take it from here (their base), with the rest

# functools, hashlib, importlib, json, sysconfig and tempfile are imported where used: sitecustomize imports this
# module in every process of a served pod, and only those that call triton_key() or set hooks need them; and every
# no-op install reads triton_files through format/envscan.py, where each import costs a pod start.

SOURCES = ("compiler", "backends", "language")  # the packages triton_key() walks, besides runtime/cache.py
ENV_VAR = "KERNELCACHE_TRITON_KEYS"
DEBUG_ENV = "KERNELCACHE_DEBUG"  # set (not "" or "0"): each kept record used or refused is said on stderr


def debugging() -> bool:
    """Whether ``KERNELCACHE_DEBUG`` asks for the log (one environment lookup: free when it is unset)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def say(subject: str, outcome: str, why: str = "") -> None:
    """One line on stderr, ``kernelcache[pid]: subject: outcome (why)``, when ``KERNELCACHE_DEBUG`` is set."""
    if debugging():
        print(f"kernelcache[{os.getpid()}]: {subject}: {outcome}" + (f" ({why})" if why else ""), file=sys.stderr,
              flush=True)


def triton_files(root: str) -> dict[str, list[int]]:
    """Every file ``triton_key()`` reads under the Triton directory ``root``, by relative path -> stat.

    ``__init__.py`` holds ``__version__``; the ``.py`` files under ``SOURCES`` and the shared libraries in
    ``_C`` are a superset of what ``pkgutil.walk_packages`` and the libtriton read open."""
    paths = [os.path.join(root, "runtime", "cache.py"), os.path.join(root, "__init__.py")]
    for sub in SOURCES:
        for folder, dirs, files in os.walk(os.path.join(root, sub)):
            dirs.sort()
            paths += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
    lib = os.path.join(root, "_C")
    try:
        libraries = os.listdir(lib)
    except OSError:
        libraries = []
    paths += sorted(os.path.join(lib, f) for f in libraries if ".so" in f or f.endswith(".pyd"))
    stamps = {os.path.relpath(path, root): stamp(path) for path in paths}
    return {rel: found for rel, found in stamps.items() if found is not None}


def record_path(folder: str, root: str) -> str:
    import hashlib
    import sysconfig

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ""
    return os.path.join(folder, hashlib.sha256(f"{root}\0{suffix}".encode()).hexdigest()[:32] + ".json")


def triton_root(cache_module) -> str:
    """The Triton directory of ``triton.runtime.cache`` (the module object), as triton_key() finds it."""
    return os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(cache_module.__file__))))


def kept_key(folder: str, root: str) -> str | None:
    """The key kept for ``root`` in ``folder`` if every file it was computed from is unchanged, else None."""
    return check_key(folder, root)[0]


def check_key(folder: str, root: str) -> tuple[str | None, str]:
    """(the kept key or None, why): what ``kept_key`` decides, and the reason it says under KERNELCACHE_DEBUG."""
    import json
    import sysconfig

    path = record_path(folder, root)
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except OSError:
        return None, f"no record {path}"
    except ValueError:
        return None, f"unreadable record {path}"
    if not isinstance(record, dict) or record.get("root") != root:
        return None, f"the record names another Triton dir than {root}"
    key = record.get("triton_key")
    if record.get("suffix") != sysconfig.get_config_var("EXT_SUFFIX") or not isinstance(key, str) or not key:
        return None, "the record is for another interpreter (extension suffix) or holds no key"
    files = triton_files(root)
    if record.get("files") == files:
        return key, f"every file's stat as recorded in {path}"
    changed = _first_difference(root, record.get("content"), files)
    if changed:
        return None, changed
    try:  # a read-only cache keeps the old stats: the next process checks again
        _write(folder, root, {**record, "files": files})
        restamped = "record restamped"
    except OSError:
        restamped = "record read-only, not restamped"
    return key, f"new stats, same contents ({restamped})"


def _first_difference(root: str, content, files: dict) -> str:
    """Why ``files`` (this walk) are not the recorded files with the recorded identities; "" when they are."""
    if not isinstance(content, dict):
        return "files changed since the record and it keeps no contents"
    if set(content) != set(files):
        extra = sorted(set(content) ^ set(files))
        return f"{len(extra)} file(s) added or removed, e.g. {extra[0]}"
    for rel, ident in content.items():
        if ident is None or identity(os.path.join(root, rel)) != ident:
            return f"contents changed: {rel}"
    return ""


def identity(path: str) -> str | None:
    """A file's contents in one string: ``elf:<size>:<GNU build ID>`` for a shared library that has one,
    else ``sha256:<hex>`` for a file up to 16 MiB, else None (too big to hash cheaply: not checked)."""
    import hashlib

    try:
        size = os.path.getsize(path)
        build = build_id(path)
        if build:
            return f"elf:{size}:{build}"
        if size > 16 << 20:
            return None
        with open(path, "rb") as f:
            return "sha256:" + hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def build_id(path: str) -> str | None:
    """The GNU build ID note of a 64-bit little-endian ELF file (its PT_NOTE segments), or None."""
    import struct

    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        (phoff,), (phentsize, phnum) = struct.unpack_from("<Q", head, 0x20), struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum if len(table) == phentsize * phnum else 0):
            kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if kind == 4:  # PT_NOTE
                f.seek(offset)
                found = _gnu_build_id(f.read(min(size, 1 << 16)))
                if found:
                    return found
    return None


def _gnu_build_id(notes: bytes) -> str | None:
    import struct

    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from("<III", notes, pos)
        name = pos + 12
        desc = name + ((namesz + 3) & ~3)
        if kind == 3 and notes[name:name + namesz] == b"GNU\0":  # NT_GNU_BUILD_ID
            return notes[desc:desc + descsz].hex() or None
        pos = desc + ((descsz + 3) & ~3)
    return None


def save_key(folder: str, root: str, key: str, files: dict[str, list[int]]) -> None:
    """Keep ``key``, computed from ``files`` (their stats before the computation), in ``folder``: one rename.
    Each file's identity is kept too, unless a file changed meanwhile (then only the stats can match)."""
    import sysconfig

    content = {rel: identity(os.path.join(root, rel)) for rel in files}
    record = {"root": root, "suffix": sysconfig.get_config_var("EXT_SUFFIX"), "files": files, "triton_key": key,
              "content": content if triton_files(root) == files else None}
    _write(folder, root, record)


def _write(folder: str, root: str, record: dict) -> None:
    write_json(record_path(folder, root), record)


def write_json(path: str, record: dict) -> None:
    """``record`` as JSON at ``path``, whole or not at all: a temporary file beside it, then one rename."""
    import json
    import tempfile

    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(record))  # one string from the C encoder: json.dump writes piece by piece
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def seed(cache_module, folder: str | None = None) -> None:
    """Replace ``cache_module.triton_key`` by one that returns the kept key when it still holds."""
    folder = folder or os.environ.get(ENV_VAR)
    original = getattr(cache_module, "triton_key", None)
    if not folder or original is None or getattr(original, "kernelcache_seeded", False):
        return
    root = triton_root(cache_module)
    import functools

    @functools.cache
    def triton_key() -> str:
        key, why = check_key(folder, root)
        say("triton_key()", "kept value used" if key else "refused the kept value, Triton computes it", why)
        return key or original()

    triton_key.kernelcache_seeded = True
    triton_key.__wrapped__ = original
    cache_module.triton_key = triton_key


class AfterImport:
    """Let module ``name`` load normally, then call ``then(module)`` (once). Also sitecustomize's hook.

    A meta path finder by its ``find_spec`` alone (importlib.abc's base class would cost every no-op install the
    import of importlib.resources). ``tag`` names what ``then`` does, so the same hook is not set twice."""

    def __init__(self, name, then, tag: str = ""):
        self.name, self.then, self.tag = name, then, tag

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec


CACHE_MODULE = "triton.runtime.cache"
JIT_MODULE = "triton.runtime.jit"


def seed_on_import(folder: str) -> None:
    """Seed this process from ``folder``: ``triton.runtime.cache``'s key, the kept tool outputs of Triton's
    modules and ``file``'s answer to ``platform.architecture()`` (kernelcache_outputs), the helper modules its gcc
    step would build (kernelcache_prebuilt) and the kept dependency walks of its ``@jit`` functions
    (kernelcache_walks); each module now if it is imported, else when it is."""
    import functools

    outputs, prebuilt = _site_module("kernelcache_outputs"), _site_module("kernelcache_prebuilt")
    hooks = [(CACHE_MODULE, functools.partial(seed, folder=folder), "triton_key")]
    hooks += [(name, functools.partial(outputs.seed, folder=folder), "outputs") for name in outputs.MODULES]
    hooks += [(outputs.BUILD_MODULE, functools.partial(outputs.seed_platform, folder=folder), "file")]
    hooks += [(prebuilt.MODULE, functools.partial(prebuilt.seed, folder=folder), "prebuilt")]
    if os.environ.get("KERNELCACHE_REPLAY_WALKS", "1") != "0":  # kernelcache_walks.OFF_ENV
        hooks += [(JIT_MODULE, functools.partial(_site_module("kernelcache_walks").seed, folder=folder), "walks")]
    for name, then, tag in hooks:
        module = sys.modules.get(name)
        if module is not None:
            then(module)
        elif not any(isinstance(f, AfterImport) and (f.name, f.tag) == (name, tag) for f in sys.meta_path):
            sys.meta_path.insert(0, AfterImport(name, then, tag))


def _site_module(name: str):
    """A sibling module of this directory, whichever way this one was imported."""
    # As kernelcache.hooks.<name>, or from the served site dir (as sitecustomize imports this one).
    import importlib

    return importlib.import_module(f"{__package__}.{name}" if __package__ else name)
