"""The build cache: every kernel a build compiled, kept under its Triton cache key, so that later builds -- of any
recipe, GPU profile or CI runner -- take it instead of compiling it again.

The key is Triton's own (``triton_key()``, the source hash, the specialisation, the target, the set key
variables: the cache directory name ``compile()`` asks its cache manager for), so an entry is reused exactly
where Triton itself would take it from its cache. Each exercise process of a build runs with Triton's cache
manager hook pointed at ``buildcache/manager.py``: a key missing from the build's own ``TRITON_CACHE_DIR`` is
looked up here, checked (every file against its sha256; every path it embeds this process's own) and written
into that dir, where ``compile()`` finds it as a disk hit; a key compiled is published here. The build's
harvest reads its ``TRITON_CACHE_DIR`` as before, so its bundles are byte for byte those of a build without
the cache; the build's result counts what was reused.

Where (``resolve``): ``--build-cache DIR|URL``, else ``$KERNELCACHE_BUILD_CACHE`` (a directory, a URL, or
``off``), else ``$XDG_CACHE_HOME/kernelcache/build`` (``~/.cache/kernelcache/build``); ``--no-build-cache`` (or
``build_cache=False``) builds without one. URLs: ``oci://HOST/REPOSITORY`` and fsspec URLs (``s3://``, ``gs://``,
``file://``), shared by every runner that names them (buildcache/store.py).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import KernelcacheError, RemoteError, StorageError, UsageError
from ..usercache import user_cache

ENV = "KERNELCACHE_BUILD_CACHE"
MANAGER = "kernelcache.buildcache.manager:BuildCacheManager"
OFF = "off"
BUILD_LOCAL = "build"


@dataclass(frozen=True)
class BuildCacheSpec:
    """A resolved build cache: a local directory (``kind`` "dir") or a shared URL ("url": fsspec, "oci"); "build": a
    directory in one build's scratch dir, where the targets of a build without a build cache share what they
    compiled (``for_one_build``), reported as no build cache."""

    location: str  # an absolute directory, or the URL as given
    kind: str

    @property
    def reported(self) -> str | None:
        """The location a build reports (None for one build's own)."""
        return None if self.kind == BUILD_LOCAL else self.location

    def worker_env(self) -> dict[str, str]:
        """What an exercise process needs to use it: Triton's cache manager hook and the location."""
        return {"TRITON_CACHE_MANAGER": MANAGER, ENV: self.location}

    def to_dict(self) -> dict:
        return {"location": self.location, "kind": self.kind}


def default_dir() -> Path:
    return user_cache("build")


def resolve(value: str | os.PathLike | bool | None = None) -> BuildCacheSpec | None:
    """``value`` (a directory, a URL, False for none, None for the default) as a ``BuildCacheSpec``; None: off."""
    if value is False:
        return None
    if value is None or value is True:
        value = os.environ.get(ENV, "").strip() or default_dir()
    text = os.fspath(value)
    if text.lower() == OFF:
        return None
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme == "memory":
            raise UsageError("--build-cache memory:// lives in one process; the build's exercise processes could "
                             "not share it (use a directory or file://)")
        return BuildCacheSpec(text, "oci" if scheme == "oci" else "url")
    return BuildCacheSpec(os.path.abspath(os.path.expanduser(text)), "dir")


def for_one_build(scratch: Path) -> BuildCacheSpec:
    """A build cache for one build's targets only. Without it, a target that copies a unit another target ran
    (buildcache/exercises.py ``copy_unit``) could not tell which gcc-built helper modules the unit used: only the
    build cache's events name their keys."""
    return BuildCacheSpec(str(scratch / "build-cache"), BUILD_LOCAL)


def open_store(spec: BuildCacheSpec):
    """The store behind ``spec`` (buildcache/store.py)."""
    from . import store

    if spec.kind in ("dir", BUILD_LOCAL):
        return store.DirStore(spec.location)
    return store.OciStore(spec.location) if spec.kind == "oci" else store.UrlStore(spec.location)


def check(spec: BuildCacheSpec | None) -> None:
    """Before a build compiles anything: a directory that can be made and written, a URL that answers.
    ``UsageError`` (not a directory, a malformed URL), ``StorageError`` (cannot be written), ``RemoteError``
    (cannot be reached), ``MissingDependency`` (fsspec or oras is not installed)."""
    if spec is None:
        return
    if spec.kind == "dir":
        _check_dir(Path(spec.location))
        return
    try:
        open_store(spec).check()
    except KernelcacheError:
        raise
    except NotADirectoryError:
        raise UsageError(f"--build-cache {spec.location} is not a directory") from None
    except FileExistsError:
        raise UsageError(f"--build-cache {spec.location} is not a directory") from None
    except OSError as exc:
        raise RemoteError(f"--build-cache {spec.location}: cannot reach it: {exc.strerror or exc}") from None
    except Exception as exc:  # each fsspec backend raises its own transport errors
        raise RemoteError(f"--build-cache {spec.location}: cannot reach it: {type(exc).__name__}: {exc}") from None


def _check_dir(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise UsageError(f"--build-cache {root} is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"--build-cache {root}: cannot create it: {exc.strerror or exc}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise StorageError(f"--build-cache {root} is not writable here (use --no-build-cache to build without it)")


@dataclass(frozen=True)
class RecordCounts:
    """What one target did with exercise records (buildcache/exercises.py)."""

    reused: int = 0  # units whose exercise process did not run: their record was restored
    kept: int = 0  # units run and recorded for the next build
    not_kept: str | None = None  # why this target's units were not recorded (None: they were, or none ran)
    errors: tuple[str, ...] = field(default_factory=tuple)
    kernels: int = 0  # kernels the restored units' records brought from the build cache
    modules: int = 0  # gcc-built helper modules they brought

    def to_dict(self) -> dict:
        return {"reused": self.reused, "kept": self.kept, "not_kept": self.not_kept, "errors": list(self.errors)}


@dataclass(frozen=True)
class BuildCacheCounts:
    """What one build target's exercise processes did with the build cache (their ``build_cache`` log events)."""

    location: str | None = None  # None: the target was built without a build cache
    reused: int = 0  # kernels taken from the build cache (or another target of this build) instead of compiled
    reused_modules: int = 0  # gcc-built helper modules (launchers, cuda_utils) taken from it
    published: int = 0  # entries this target compiled and wrote to it
    corrupt: int = 0  # entries found that failed their check: compiled again and written anew
    foreign: int = 0  # entries whose files embed paths of another install: compiled here, not reused
    errors: tuple[str, ...] = field(default_factory=tuple)  # store failures (the build went on without it)
    flashinfer: str | None = None  # FlashInfer's module: "reused", "published", "corrupt" (built again); None: none
    units: RecordCounts | None = None  # exercise records (buildcache/exercises.py); None: the build kept none
    bundles: int = 0  # bundles whose compressed bytes came from the build cache (buildcache/frames.py)

    @classmethod
    def of(cls, location: str | None, events: tuple[dict, ...], flashinfer: str | None = None,
           units: RecordCounts | None = None) -> BuildCacheCounts:
        """From the ``build_cache`` log records of the exercise processes that ran, what FlashInfer's module did
        (buildcache/flashinfer_modules.py ``take_or_build``), and what the exercise records did."""
        seen = {(e.get("outcome"), e.get("kind"), e.get("key")) for e in events}
        counts = Counter((outcome, kind) for outcome, kind, _ in seen)
        errors = {str(e.get("detail")) for e in events if e.get("outcome") == "error"}
        if flashinfer and flashinfer.startswith("error: "):
            errors.add(f"FlashInfer's module: {flashinfer.removeprefix('error: ')}")
        restored = units or RecordCounts()
        errors.update(f"exercise records: {e}" for e in restored.errors)
        return cls(location, counts[("hit", "kernel")] + restored.kernels, counts[("hit", "module")] + restored.modules,
                   sum(n for (outcome, _), n in counts.items() if outcome == "published"),
                   sum(n for (outcome, _), n in counts.items() if outcome == "corrupt"),
                   sum(n for (outcome, _), n in counts.items() if outcome == "foreign"), tuple(sorted(errors)),
                   flashinfer.split(":")[0] if flashinfer else None, units)

    def to_dict(self) -> dict:
        return {"location": self.location, "reused": self.reused, "reused_modules": self.reused_modules,
                "published": self.published, "corrupt": self.corrupt, "foreign": self.foreign,
                "errors": list(self.errors), "flashinfer": self.flashinfer,
                "units": self.units.to_dict() if self.units else None, "bundles": self.bundles}
