"""Point Triton (and FlashInfer) at an installed cache: shell exports, exec, or in-process.

Everything is carried by environment variables, so it reaches vLLM's engine and worker
processes: vLLM sets ``TRITON_CACHE_DIR`` itself only when it is unset (``initialize_inductor_cache``
in vllm/compilation/compiler_interface.py), so one set before it starts is kept.
When the cache holds FlashInfer modules, runtime/flashinfer_env.py adds PYTHONPATH (its provider
registration) and ``FLASHINFER_DISABLE_JIT=1``. When it keeps Triton's ``triton_key()`` (written by the
install that computed it), ``KERNELCACHE_TRITON_KEYS`` and kernelcache's site dir on PYTHONPATH let
served processes skip hashing libtriton.so (hooks/kernelcache_tritonkey.py). When an installed bundle
carries autotune choices (``kernelcache tune``), ``TRITON_CACHE_AUTOTUNING=1`` lets Triton read them instead of
timing, and ``KERNELCACHE_AUTOTUNE_CHECK=1`` with the site dir guards that read (hooks/kernelcache_autotune.py);
without choices none of these is set. When a bundle installed vLLM's torch.compile artifact (the compile path,
enginecompile.py), ``VLLM_CACHE_ROOT`` points at it and ``VLLM_FORCE_AOT_LOAD=1`` makes a miss fail loudly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import enginecompile
from ..bundle.trust import Policy, policy
from ..cachedir import CacheDir, recover
from ..errors import AlreadyActivated, ReadOnlyCache, UsageError
from ..hooks import kernelcache_autotune, kernelcache_tritonkey
from . import flashinfer_env
from .match import check as check_served
from .served import remember_served, snapshot
from .shell import exec_command, shell_exports


def environment(cache: CacheDir) -> dict[str, str]:
    """The variables that make Triton and FlashInfer use the installed cache ``cache``."""
    variables = {"TRITON_CACHE_DIR": str(cache.root)}
    variables.update(flashinfer_env.environment(cache.root))
    variables.update(triton_key_environment(cache, variables))
    variables.update(autotune_environment(cache, variables))
    variables.update(enginecompile.environment(cache.root))
    return variables


def triton_key_environment(cache: CacheDir, variables: dict[str, str]) -> dict[str, str]:
    """``KERNELCACHE_TRITON_KEYS`` and the site dir on PYTHONPATH, if ``cache`` keeps Triton keys."""
    folder = cache.triton_keys
    if not folder.is_dir():
        kernelcache_tritonkey.say("kept Triton records", "none", f"no {folder}: served processes compute "
                                  "triton_key() and run Triton's tool queries themselves")
        return {}
    kernelcache_tritonkey.say("kept Triton records", str(folder), "KERNELCACHE_TRITON_KEYS set, kernelcache's site "
                              "dir on PYTHONPATH")
    return {kernelcache_tritonkey.ENV_VAR: str(folder), "PYTHONPATH": site_path(variables)}


def autotune_environment(cache: CacheDir, variables: dict[str, str]) -> dict[str, str]:
    """Triton's autotune cache on, guarded (hooks/kernelcache_autotune.py), if a bundle installed in
    ``cache`` put autotune choices there; nothing otherwise."""
    if not cache.choices_installed():
        return {}
    return {**kernelcache_autotune.environment(), "PYTHONPATH": site_path(variables)}


def site_path(variables: dict[str, str]) -> str:
    """PYTHONPATH with kernelcache's site dir after FlashInfer's provider dirs and before every other entry: its
    sitecustomize must not be shadowed by another one (it runs the one it shadows itself)."""
    from .overlay import SITE_DIR

    current = variables.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    entries = [p for p in current.split(os.pathsep) if p and p != str(SITE_DIR)]
    providers = [p for p in entries if flashinfer_env.is_site_path(p)]
    path = [*providers, str(SITE_DIR), *(p for p in entries if p not in providers)]
    return os.pathsep.join(dict.fromkeys(path))


@dataclass(frozen=True)
class CacheEnvironment:
    """The variables that point Triton (and FlashInfer) at a cache, and what was noticed on the way."""

    variables: dict[str, str]
    read_only: bool = False
    warnings: tuple[str, ...] = ()

    def exports(self) -> str:
        return shell_exports(self.variables)

    def to_dict(self) -> dict:
        return {"variables": dict(self.variables), "read_only": self.read_only, "warnings": list(self.warnings)}


def env(cache_dir: str | os.PathLike | None = None, *, read_only: bool = False,
        base: str | os.PathLike | None = None, overlay: str | os.PathLike | None = None,
        miss_log: str | os.PathLike | None = None) -> CacheEnvironment:
    """The environment for an installed cache (``kernelcache env``): interrupted installs finished first.

    ``read_only``: serve hits from the read-only installed cache ``base`` (default: ``cache_dir``) and
    compile misses into the writable ``overlay``, logging each to ``miss_log`` (runtime/overlay.py).
    """
    cache = served_cache(cache_dir, read_only, base, overlay, miss_log)
    return overlay_env(cache, overlay, miss_log) if read_only else CacheEnvironment(prepare(None, cache))


def served_cache(cache_dir: str | os.PathLike | None, read_only: bool, base: str | os.PathLike | None,
                 overlay: str | os.PathLike | None, miss_log: str | os.PathLike | None) -> CacheDir:
    """The cache dir ``env`` / ``run`` serve, resolved once: ``base`` (read-only) or ``cache_dir``, the default
    one when neither is given."""
    if not read_only:
        given = [flag for flag, value in (("--base", base), ("--overlay", overlay), ("--miss-log", miss_log)) if value]
        if given:
            raise UsageError(f"{', '.join(given)} only make sense with --read-only")
    elif base is not None and cache_dir is not None:
        raise UsageError("give the read-only cache as --base or as --cache-dir, not both")
    return CacheDir.at(base if base is not None else cache_dir)


def overlay_env(cache: CacheDir, overlay: str | os.PathLike | None,
                miss_log: str | os.PathLike | None) -> CacheEnvironment:
    """The read-only ``cache`` served through a writable overlay (runtime/overlay.py)."""
    from .overlay import prepare_overlay

    setup = prepare_overlay(cache, overlay, miss_log)
    warnings = () if setup.bundles else (f"{setup.base.root} holds no kernelcache install receipt; serving it as a "
                                         "plain Triton cache",)
    return CacheEnvironment(setup.environment(), True, warnings)


def prepare(bundle: str | os.PathLike | None, cache: CacheDir, force: bool = False,
            signature_policy: Policy | None = None) -> dict[str, str]:
    """Install ``bundle`` if given (a no-op when already there), finish interrupted installs; the variables of the
    cache dir. ``signature_policy``: what the bundle's signature must be (None: from the environment)."""
    if bundle is not None:
        install_checked(bundle, cache, force, signature_policy or policy())
    check_read_only(cache)
    root = cache.root
    if root.is_dir() and os.access(root, os.W_OK):
        recover(cache)
    before = snapshot(root)
    variables = environment(cache)
    remember_served(root, variables, before)  # the next start only checks them (served.py)
    return variables


def install_checked(bundle: str | os.PathLike, cache: CacheDir, force: bool, signature_policy: Policy) -> None:
    """Install ``bundle`` into ``cache`` unless it was accepted here before under what holds now: asked once
    (cachedir/checked.py), so the installer (install.py) is loaded only when the answer is no."""
    from ..cachedir.checked import find_checked

    if find_checked(bundle, cache.root, policy=signature_policy) is None:
        from ..install import install_into

        install_into(bundle, cache, force=force, signature_policy=signature_policy)


def check_read_only(cache: CacheDir) -> None:
    """A read-only cache dir without the overlay: refuse it when every kernel would miss, else warn.

    Triton's ``FileCacheManager`` creates the directory of a key it does not find, so a key the cache
    lacks raises ``OSError: [Errno 30] Read-only file system`` inside the engine instead of compiling
    (https://github.com/triton-lang/triton/blob/main/python/triton/runtime/cache.py). A cache installed
    at another path than the one it is served from misses every kernel, since its group files name
    the install path: refused. Served where it was installed, it hits whatever the bundle holds: a
    warning. ``--read-only`` serves either through an overlay that writes misses elsewhere.
    """
    root = cache.root
    if not root.is_dir() or os.access(root, os.W_OK):
        return
    here = os.path.realpath(root)
    elsewhere = sorted({r.cache_dir for r in cache.receipts()
                        if r.cache_dir and os.path.realpath(r.cache_dir) != here})
    if elsewhere:
        raise ReadOnlyCache(
            f"{root} is read-only and was installed at {elsewhere[0]}: Triton would miss every kernel and crash "
            "the engine on the first miss (EROFS); use --read-only to serve it with a writable overlay for misses"
        )
    print(f"kernelcache: warning: {root} is read-only: a kernel the bundle lacks would crash the engine (EROFS) "
          "instead of compiling; --read-only serves it with a writable overlay for misses", file=sys.stderr)


def activate(*, bundle: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
             force: bool = False, require_signature: bool | None = None,
             trusted_keys: Sequence[str | os.PathLike] | None = None) -> dict[str, str]:
    """Use a bundle (installed into ``cache_dir`` first) or an installed cache dir in this process and its children.

    ``activate(bundle="/bundles/b.tar.zst")`` installs (a no-op when already there) into ``cache_dir``,
    default as ``kernelcache install``; ``activate(cache_dir="/caches/c")`` uses what is installed there.
    ``require_signature`` / ``trusted_keys`` (None: ``KERNELCACHE_REQUIRE_SIGNATURE`` / ``KERNELCACHE_TRUSTED_KEYS``)
    refuse a bundle no trusted key signed, as ``kernelcache install`` does.
    A bundle that is not a file, or a cache dir that does not exist, is refused (``UsageError``): a
    mistyped path must not become a silent cold start. Call it before importing triton or vllm. Raises
    ``AlreadyActivated`` when Triton's cache dir was already pinned in this process to somewhere else.
    """
    if bundle is not None and not Path(bundle).is_file():
        raise UsageError(f"bundle {bundle} does not exist (or is not a file)")
    cache = CacheDir.at(cache_dir)
    if bundle is None and not cache.root.is_dir():
        raise UsageError(f"cache dir {cache.root} does not exist; install a bundle into it first (or pass bundle=...)")
    variables = prepare(bundle, cache, force, policy(require_signature, trusted_keys) if bundle else None)
    _refuse_if_pinned(variables["TRITON_CACHE_DIR"])
    if any(flashinfer_env.is_site_path(p) for p in variables.get("PYTHONPATH", "").split(os.pathsep)):
        _refuse_if_flashinfer_loaded()
    os.environ.update(variables)
    _extend_sys_path(variables.get("PYTHONPATH", ""))
    if kernelcache_tritonkey.ENV_VAR in variables:  # sitecustomize runs in children only
        kernelcache_tritonkey.seed_on_import(variables[kernelcache_tritonkey.ENV_VAR])
    if kernelcache_autotune.ENV_VAR in variables:
        kernelcache_autotune.guard_on_import()
    return variables


def run(command: Sequence[str], bundle: str | os.PathLike | None = None,
        cache_dir: str | os.PathLike | None = None, force: bool = False, *, read_only: bool = False,
        base: str | os.PathLike | None = None, overlay: str | os.PathLike | None = None,
        miss_log: str | os.PathLike | None = None, require_signature: bool | None = None,
        trusted_keys: Sequence[str | os.PathLike] | None = None, strict: bool = False) -> CacheEnvironment:
    """Install ``bundle`` if given, then replace this process with ``command`` in the cache's environment.

    A ``vllm serve`` command is first compared with the installed bundles' serve commands (runtime/match.py): a
    flag that changes kernel keys and differs is a warning, or with ``strict`` a ``ServeMismatch``.
    ``read_only`` and its options are ``env``'s; they serve an installed cache, so they take no bundle.
    ``require_signature`` / ``trusted_keys``: the bundle's signature policy, as ``activate``'s.
    Returns only when ``command`` cannot be run (it raises then)."""
    if not command:
        raise UsageError("nothing to run: give a command after --")
    if read_only and bundle is not None:
        raise UsageError("--read-only serves an installed cache; install --bundle into it first")
    cache = served_cache(cache_dir, read_only, base, overlay, miss_log)
    if read_only:
        found = overlay_env(cache, overlay, miss_log)
    else:
        signature_policy = policy(require_signature, trusted_keys) if bundle is not None else None
        found = CacheEnvironment(prepare(bundle, cache, force, signature_policy))
    check_served(command, cache.root, strict)
    exec_command(command, found.variables)
    return found


def _extend_sys_path(pythonpath: str) -> None:
    """PYTHONPATH reaches child processes; this process needs the same entries in sys.path."""
    import importlib

    new = [p for p in pythonpath.split(os.pathsep) if p and p not in sys.path]
    sys.path[0:0] = new
    if new:
        importlib.invalidate_caches()


def _refuse_if_flashinfer_loaded() -> None:
    if "flashinfer.jit.env" in sys.modules:
        raise AlreadyActivated(
            "flashinfer is already imported in this process and has fixed its prebuilt-module providers; "
            "call kernelcache.activate() before importing flashinfer or vllm"
        )


def _refuse_if_pinned(wanted: str) -> None:
    knobs = sys.modules.get("triton.knobs")
    if knobs is None:
        return
    pinned = knobs.cache.__dict__.get("dir")
    if pinned is not None and os.path.abspath(pinned) != os.path.abspath(wanted):
        raise AlreadyActivated(
            f"triton.knobs.cache.dir is already set to {pinned} in this process; call "
            "kernelcache.activate() before anything configures Triton"
        )
