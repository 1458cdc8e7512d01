"""Make FlashInfer load the installed modules: jit-cache providers behind its own entry point.

FlashInfer trusts two places for a prebuilt module (``get_aot_artifacts`` in flashinfer/jit/env.py): the
package's ``flashinfer/data/aot/<name>/<name>.so``, loaded with no version or arch check and only where
site-packages is writable, and providers registered in the ``flashinfer.jit_cache.providers``
entry-point group, which FlashInfer checks against its version and the GPU's arch. kernelcache uses
the providers (docs/FLASHINFER.md says why); cachedir/flashinfer_site.py generates their registration
in the cache dir. ``environment`` adds it to PYTHONPATH (the shim dir only when the real
flashinfer-jit-cache is not installed) and sets ``FLASHINFER_DISABLE_JIT=1`` (unless the user set that
variable), so a module the cache lacks fails loudly instead of compiling. Before that it checks what
FlashInfer cannot: the module's version against the installed FlashInfer, and each file's sha256
against the manifest it was installed from.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

from ..cachedir import STATE_DIR
from ..cachedir.flashinfer_site import SHIM_PACKAGE, SITE_DIR, ensure_site, installed_modules, providers
from ..cachedir.layout import SITE_PREFIX
from ..errors import FingerprintMismatch
from ..format.envscan import distribution_version
from ..hooks.kernelcache_tritonkey import say
from .workspace import workspace_base

# -- the environment --------------------------------------------------------------------------------


def real_shim_installed() -> bool:
    """Whether the real flashinfer-jit-cache shim is importable (kernelcache's own dirs left out)."""
    paths = [p for p in sys.path if not is_site_path(p)]
    return importlib.machinery.PathFinder.find_spec(SHIM_PACKAGE, paths) is not None


def environment(cache_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that make FlashInfer load the modules installed in ``cache_dir``; {} when none.

    ``base`` is the environment they are added to (default: this process's).
    """
    base = dict(os.environ if base is None else base)
    root = Path(cache_dir)
    modules = installed_modules(root)
    if not modules:
        return {}
    version = distribution_version("flashinfer-python")
    if version is None:
        say("FlashInfer modules", "not served", f"{len(modules)} installed, flashinfer-python is not installed here")
        return {}
    found, other = providers(root, version, modules)
    if not found:
        built = ", ".join(sorted({m.version for m in other}))
        raise FingerprintMismatch(
            f"the FlashInfer modules in {root} were built for flashinfer {built}, but flashinfer {version} is "
            "installed; FlashInfer would compile them again", [("flashinfer", built, version)])
    site = ensure_site(root, found)
    left_out = f"; {len(other)} module(s) of other versions left out" if other else ""
    say("FlashInfer modules", f"served by {len(found)} provider(s) from {site}", f"flashinfer {version}{left_out}")
    paths = [site / "providers"] + ([] if real_shim_installed() else [site / "shim"])
    kept = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and not is_site_path(p)]
    variables = {"PYTHONPATH": os.pathsep.join([*map(str, paths), *kept])}
    if "FLASHINFER_DISABLE_JIT" not in base:
        variables["FLASHINFER_DISABLE_JIT"] = "1"
    workspace = workspace_base(root, base)
    if workspace is not None:
        variables["FLASHINFER_WORKSPACE_BASE"] = workspace
    return variables


def is_site_path(path: str) -> bool:
    """A generated site dir (of any kernelcache cache): ``.../.kernelcache/flashinfer/site-*/...``."""
    parts = Path(path).parts
    return any(parts[i:i + 2] == (STATE_DIR, SITE_DIR) and parts[i + 2].startswith(SITE_PREFIX)
               for i in range(len(parts) - 2))
