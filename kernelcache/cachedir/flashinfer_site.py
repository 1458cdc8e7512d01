"""FlashInfer's provider registration for the modules installed in a cache dir.

FlashInfer loads a prebuilt module from providers registered in the ``flashinfer.jit_cache.providers``
entry-point group, which it checks against its version and the GPU's arch (``get_aot_artifacts`` in
flashinfer/jit/env.py). For an installed cache dir this module generates, under
``<cache>/.kernelcache/flashinfer/site-<digest>/``:

* ``providers/``: a small module and a ``.dist-info`` registering one provider per installed
  module directory (``<cache>/flashinfer/<version>-<archs>-<sha12>/``);
* ``shim/flashinfer_jit_cache/``: kernelcache's stand-in for the shim package that reads the
  entry points (flashinfer_shim.py), for when the real one is not installed.

The directory is named by the sha256 of its content and published with one rename, so it is
written once (by ``install``, or by the first ``env`` where the cache is writable) and only read
afterwards. Before that, ``providers`` checks what FlashInfer cannot: each file's sha256 against the
manifest it was installed from. runtime/flashinfer_env.py puts the dirs on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BundleManifestError, IntegrityError, StorageError
from .layout import FLASHINFER_SITE_DIR, SITE_PREFIX
from .state import STATE_DIR, CacheDir

if TYPE_CHECKING:  # `kernelcache env` imports this module on every pod start; the manifest only where read
    from ..format.manifest import FlashInferModule

PROVIDER_GROUP = "flashinfer.jit_cache.providers"
SITE_DIR = FLASHINFER_SITE_DIR  # under <cache>/.kernelcache/
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
    """Every FlashInfer module the install receipts of ``cache_dir`` list, each once.

    Read from the receipts' raw JSON (their kernels are never built into records); a receipt that cannot be read
    that way is read the full way, which leaves out bad receipts as every reader of them does."""
    from ..format.manifest import flashinfer_module

    cache = CacheDir(Path(cache_dir))
    entries, modules = cache.flashinfer_entries(), None
    if entries is not None:
        with contextlib.suppress(TypeError, ValueError, BundleManifestError):
            modules = [flashinfer_module(m) for m in entries]
    if modules is None:
        modules = [m for receipt in cache.receipts() for m in receipt.manifest.flashinfer]
    found: dict[tuple, FlashInferModule] = {}
    for module in modules:
        found.setdefault(tuple(f.path for f in module.files), module)
    return [found[key] for key in sorted(found)]


def providers(cache_dir: Path, version: str, modules: list[FlashInferModule] | None = None
              ) -> tuple[list[Provider], list[FlashInferModule]]:
    """(providers for the modules built for FlashInfer ``version``, modules of other versions); ``modules``:
    ``installed_modules(cache_dir)`` when the caller has it already.

    Raises ``IntegrityError`` when an installed module file is missing or is not the file its
    manifest hashed: FlashInfer would load whatever sits at that path.
    """
    root = Path(cache_dir)
    usable: dict[Path, list[FlashInferModule]] = {}
    other = []
    for module in installed_modules(root) if modules is None else modules:
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
    from ..format.manifest import FLASHINFER_ROOT

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


# The debug log's line (KERNELCACHE_DEBUG, hooks/kernelcache_tritonkey.say) when FlashInfer asks a provider.
_SAY = """

def _say(provider):
    if os.environ.get("KERNELCACHE_DEBUG", "") not in ("", "0"):
        print(f"kernelcache[{os.getpid()}]: FlashInfer provider: handed to FlashInfer ({', '.join(provider['modules'])}"
              f" for flashinfer {provider['version']} from {provider['jit_cache_dir']})", file=sys.stderr, flush=True)
"""


def site_files(found: list[Provider]) -> dict[str, str]:
    """Relative path -> text of the generated site dir for these providers."""
    body = json.dumps([p.mapping() for p in found], indent=1, sort_keys=True)
    name = "kernelcache_fi_" + hashlib.sha256(body.encode()).hexdigest()[:12]
    factories = "".join(f"\n\ndef provider_{i}():\n    _say(PROVIDERS[{i}])\n    return dict(PROVIDERS[{i}])\n"
                        for i in range(len(found)))
    module = (f'"""Generated by kernelcache: FlashInfer jit-cache providers (schema 1)."""\n\n'
              f"import json\nimport os\nimport sys\n\nPROVIDERS = json.loads(r'''{body}''')\n{_SAY}{factories}")
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
    site = parent / f"{SITE_PREFIX}{digest}"
    if site.is_dir():
        return site
    staging = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{SITE_PREFIX}", dir=parent))
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
    from ..format.envscan import distribution_version  # as `env` finds it (runtime/flashinfer_env.py): no import of
    # importlib.metadata (~15 ms)

    version = distribution_version("flashinfer-python")
    if version is None:
        return None
    found, _ = providers(Path(cache_dir), version)
    return ensure_site(Path(cache_dir), found) if found else None
