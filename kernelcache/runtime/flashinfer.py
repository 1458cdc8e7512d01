"""Make FlashInfer load the installed modules: jit-cache providers behind its own entry point.

FlashInfer trusts two places for a prebuilt module (``get_aot_artifacts`` in flashinfer/jit/env.py): the package's
``flashinfer/data/aot/<name>/<name>.so``, loaded with no version or arch check and only where
site-packages is writable, and providers registered in the ``flashinfer.jit_cache.providers``
entry-point group, which FlashInfer checks against its version and the GPU's arch. kernelcache uses
the providers (docs/FLASHINFER.md says why). For an installed cache dir it generates, under
``<cache>/.kernelcache/flashinfer/site-<digest>/``:

* ``providers/``: a small module and a ``.dist-info`` registering one provider per installed
  module directory (``<cache>/flashinfer/<version>-<archs>-<sha12>/``), always on PYTHONPATH;
* ``shim/flashinfer_jit_cache/``: kernelcache's stand-in for the shim package that reads the
  entry points (flashinfer_shim.py), on PYTHONPATH only when the real one is not installed.

The directory is named by the sha256 of its content and published with one rename, so it is
written once (by ``install``, or by the first ``env`` where the cache is writable) and only read
afterwards. ``environment`` adds it to PYTHONPATH and sets ``FLASHINFER_DISABLE_JIT=1`` (unless
the user set that variable), so a module the cache lacks fails loudly instead of compiling.
Before that it checks what FlashInfer cannot: the module's version against the installed
FlashInfer, and each file's sha256 against the manifest it was installed from.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..bundle.fingerprint import package_version
from ..bundle.manifest import FLASHINFER_ROOT, FlashInferModule, Manifest
from ..errors import BundleManifestError, FingerprintMismatch, IntegrityError, StorageError
from ..install import STATE_DIR, receipts

PROVIDER_GROUP = "flashinfer.jit_cache.providers"
SITE_DIR = "flashinfer"  # under <cache>/.kernelcache/
SHIM_PACKAGE = "flashinfer_jit_cache"
_SHIM_SOURCE = Path(__file__).with_name("flashinfer_shim.py")


@dataclass(frozen=True)
class Provider:
    """One directory of installed modules, as FlashInfer's provider manifest (schema 1) describes it."""

    provider_id: str
    jit_cache_dir: Path
    version: str
    archs: tuple[str, ...]
    modules: tuple[str, ...]

    def mapping(self) -> dict:
        return {"schema_version": 1, "distribution": "kernelcache", "version": self.version,
                "jit_cache_dir": str(self.jit_cache_dir), "cuda_architectures": list(self.archs),
                "modules": list(self.modules)}


# -- what is installed ------------------------------------------------------------------------------


def installed_modules(cache_dir: Path) -> list[FlashInferModule]:
    """Every FlashInfer module the install receipts of ``cache_dir`` list, each once."""
    found: dict[tuple, FlashInferModule] = {}
    for receipt in receipts(Path(cache_dir)):
        try:
            manifest = Manifest.from_dict(receipt.get("manifest"))
        except BundleManifestError:
            continue
        for module in manifest.flashinfer:
            found.setdefault(tuple(f.path for f in module.files), module)
    return [found[key] for key in sorted(found)]


def providers(cache_dir: Path, version: str) -> tuple[list[Provider], list[FlashInferModule]]:
    """(providers for the modules built for FlashInfer ``version``, modules of other versions).

    Raises ``IntegrityError`` when an installed module file is missing or is not the file its
    manifest hashed: FlashInfer would load whatever sits at that path.
    """
    root = Path(cache_dir)
    usable: dict[Path, list[FlashInferModule]] = {}
    other = []
    for module in installed_modules(root):
        if module.version != version:
            other.append(module)
            continue
        for directory in _checked_dirs(root, module):
            usable.setdefault(directory, []).append(module)
    found = []
    for directory, modules in sorted(usable.items()):
        archs = sorted({a for m in modules for a in m.archs})
        found.append(Provider(f"kernelcache-{directory.name}", directory, version, tuple(archs),
                              tuple(sorted({m.name for m in modules}))))
    return found, other


def _checked_dirs(root: Path, module: FlashInferModule) -> list[Path]:
    """The provider dirs of a module's files, after checking layout, presence and sha256."""
    dirs = []
    for record in module.files:
        parts = record.path.split("/")
        if len(parts) != 4 or parts[0] != FLASHINFER_ROOT or parts[2] != module.name or parts[3] != f"{module.name}.so":
            raise BundleManifestError(f"FlashInfer module file {record.path!r} is not {FLASHINFER_ROOT}/<dir>/"
                                      f"{module.name}/{module.name}.so")
        path = root.joinpath(*parts)
        try:
            digest = _sha256(path)
        except OSError:
            raise IntegrityError(f"{path} is missing from the installed cache; install the bundle again") from None
        if digest != record.sha256:
            raise IntegrityError(f"{path} does not match the sha256 of the bundle it was installed from")
        dirs.append(root / parts[0] / parts[1])
    return dirs


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- the generated site dir -------------------------------------------------------------------------


def site_files(found: list[Provider]) -> dict[str, str]:
    """Relative path -> text of the generated site dir for these providers."""
    body = json.dumps([p.mapping() for p in found], indent=1, sort_keys=True)
    name = "kernelcache_fi_" + hashlib.sha256(body.encode()).hexdigest()[:12]
    factories = "".join(f"\n\ndef provider_{i}():\n    return dict(PROVIDERS[{i}])\n" for i in range(len(found)))
    module = (f'"""Generated by kernelcache: FlashInfer jit-cache providers (schema 1)."""\n\n'
              f"import json\n\nPROVIDERS = json.loads(r'''{body}''')\n{factories}")
    entries = "".join(f"{p.provider_id} = {name}:provider_{i}\n" for i, p in enumerate(found))
    info = f"providers/{name}-0.dist-info"
    return {
        f"providers/{name}.py": module,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n",
        f"{info}/entry_points.txt": f"[{PROVIDER_GROUP}]\n{entries}",
        f"shim/{SHIM_PACKAGE}/__init__.py": _SHIM_SOURCE.read_text(),
    }


def ensure_site(cache_dir: Path, found: list[Provider]) -> Path:
    """The site dir for ``found``, written (once, atomically) if it is not there yet."""
    files = site_files(found)
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    parent = Path(cache_dir) / STATE_DIR / SITE_DIR
    site = parent / f"site-{digest}"
    if site.is_dir():
        return site
    staging = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".site-", dir=parent))
        for rel, text in files.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_text(text)
        os.rename(staging, site)
    except OSError as exc:
        if not site.is_dir():  # else another process published the same content first
            raise StorageError(f"the FlashInfer loader files for {cache_dir} are not there and cannot be written "
                               f"({exc.strerror or exc}); run kernelcache install where it is writable") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return site


def write_site(cache_dir: Path) -> Path | None:
    """At install time: the site dir for what the cache now holds, if this FlashInfer can use any of it."""
    version = package_version("flashinfer-python")
    if version is None:
        return None
    found, _ = providers(Path(cache_dir), version)
    return ensure_site(Path(cache_dir), found) if found else None


# -- the environment --------------------------------------------------------------------------------


def real_shim_installed() -> bool:
    """Whether the real flashinfer-jit-cache shim is importable (kernelcache's own dirs left out)."""
    paths = [p for p in sys.path if not _is_site_path(p)]
    return importlib.machinery.PathFinder.find_spec(SHIM_PACKAGE, paths) is not None


def environment(cache_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that make FlashInfer load the modules installed in ``cache_dir``; {} when none.

    ``base`` is the environment they are added to (default: this process's).
    """
    base = dict(os.environ if base is None else base)
    version = package_version("flashinfer-python")
    root = Path(cache_dir)
    if version is None or not installed_modules(root):
        return {}
    found, other = providers(root, version)
    if not found:
        built = ", ".join(sorted({m.version for m in other}))
        raise FingerprintMismatch(
            f"the FlashInfer modules in {root} were built for flashinfer {built}, but flashinfer {version} is "
            "installed; FlashInfer would compile them again", [("flashinfer", built, version)])
    site = ensure_site(root, found)
    paths = [site / "providers"] + ([] if real_shim_installed() else [site / "shim"])
    kept = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and not _is_site_path(p)]
    variables = {"PYTHONPATH": os.pathsep.join([*map(str, paths), *kept])}
    if "FLASHINFER_DISABLE_JIT" not in base:
        variables["FLASHINFER_DISABLE_JIT"] = "1"
    workspace = _workspace_base(root, base)
    if workspace is not None:
        variables["FLASHINFER_WORKSPACE_BASE"] = str(workspace)
    return variables


def _is_site_path(path: str) -> bool:
    """A generated site dir (of any kernelcache cache): ``.../.kernelcache/flashinfer/site-*/...``."""
    parts = Path(path).parts
    return any(parts[i:i + 2] == (STATE_DIR, SITE_DIR) and parts[i + 2].startswith("site-")
               for i in range(len(parts) - 2))


def _workspace_base(root: Path, base: dict[str, str]) -> Path | None:
    """Where FlashInfer may write its log and lock files when $HOME cannot take them; None: leave it.

    FlashInfer creates ``<FLASHINFER_WORKSPACE_BASE or $HOME>/.cache/flashinfer/...`` at import and
    fails there when that is read-only (common in pods). An explicit setting is never changed.
    """
    if "FLASHINFER_WORKSPACE_BASE" in base:
        return None
    home = Path(base.get("HOME") or Path.home())
    if _writable(home / ".cache" / "flashinfer"):
        return None
    for candidate in (root / STATE_DIR / SITE_DIR / "workspace", Path(tempfile.gettempdir()) /
                      f"kernelcache-flashinfer-{os.getuid()}"):
        if _writable(candidate):
            return candidate
    return None


def _writable(path: Path) -> bool:
    """Whether ``path`` exists as a writable dir or could be created (its nearest existing parent is)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False
