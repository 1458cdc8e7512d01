"""What a Triton reader would find in a cache dir, entry by entry, checked against a bundle's bytes.

Triton (3.6 ``FileCacheManager.get_group``) trusts a kernel entry once ``__grp__<name>.json``
exists and then opens the children it lists; launchers and ``cuda_utils`` are single files looked
up by name. So an entry is ``absent`` (no group file: Triton compiles), ``complete`` (group file
and every child present with the bundle's bytes, at paths inside this cache dir), or ``partial``
(anything else a reader could trip over). A module file is complete when its bytes are right.
"""

from __future__ import annotations

import json
from pathlib import Path

from kernelcache.cachedir import STATE_DIR, CacheDir
from kernelcache.format import archive
from kernelcache.format.manifest import Manifest


def expected_bytes(bundle: Path) -> dict[str, bytes]:
    return {name: data for _, name, data in archive.iter_members(bundle)}


def entry_states(cache: Path, manifest: Manifest, expected: dict[str, bytes]) -> dict[str, str]:
    states = {}
    for kernel in manifest.kernels:
        states[kernel.key] = _kernel_state(cache, kernel, expected)
    for module in manifest.modules:
        states[module.key] = _module_state(cache, module, expected)
    return states


def _kernel_state(cache: Path, kernel, expected: dict[str, bytes]) -> str:
    group = cache / kernel.key / f"__grp__{kernel.name}.json"
    if not group.exists():
        return "absent"
    try:
        children = json.loads(group.read_text())["child_paths"]
    except (OSError, ValueError, KeyError):
        return "partial"
    if f"{kernel.name}.json" not in children:
        return "partial"
    for path in children.values():
        child = Path(path)
        rel = f"{kernel.key}/{child.name}"
        if child.parent != cache / kernel.key or not child.is_file() or child.read_bytes() != expected.get(rel):
            return "partial"
    return "complete"


def _module_state(cache: Path, module, expected: dict[str, bytes]) -> str:
    found = [(cache / f.path) for f in module.files if (cache / f.path).exists()]
    if not found:
        return "absent"
    if all(p.read_bytes() == expected[str(p.relative_to(cache))] for p in found) and len(found) == len(module.files):
        return "complete"
    return "partial"


def bundle_state(cache: Path, manifest: Manifest, expected: dict[str, bytes]) -> str:
    """``none``, ``all`` or ``subset`` of the bundle's entries complete; raises on a partial entry."""
    states = entry_states(cache, manifest, expected)
    partial = sorted(k for k, s in states.items() if s == "partial")
    assert not partial, f"partial entries visible: {partial}"
    complete = sum(s == "complete" for s in states.values())
    return "none" if complete == 0 else "all" if complete == len(states) else "subset"


def leftovers(cache: Path) -> dict[str, list[str]]:
    """Staging dirs, journals and temporary files in the state dir."""
    state = cache / STATE_DIR
    return {
        "staging": sorted(p.name for p in (state / "staging").iterdir()) if (state / "staging").is_dir() else [],
        "journal": [p.name for p in CacheDir(cache).pending_journals()] if state.is_dir() else [],
        "temp": sorted(p.name for sub in ("journal", "installed") if (state / sub).is_dir()
                       for p in (state / sub).glob(".*")),
    }


def has_receipt(cache: Path, manifest: Manifest) -> bool:
    return CacheDir(cache).receipt_path(archive.bundle_digest(manifest)).is_file()
