"""Harvested entries + target + environment -> a manifest and a bundle file."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..format.archive import Frames, bundle_digest, source_date_epoch, write
from ..format.compilelog import ExerciseLog
from ..format.fingerprint import local_environment
from ..format.identity import identity_here
from ..format.manifest import (
    Build,
    EngineCompile,
    Environment,
    FileRecord,
    FlashInferModule,
    Manifest,
    Member,
    Target,
    TritonIdentity,
    TritonWalks,
    capability_to_arch,
    flag_capability,
    walks_member,
)
from ..harvest import Entry, Harvest, harvest, to_manifest_entries
from ..version import __version__


@dataclass(frozen=True)
class PackResult:
    path: Path
    manifest: Manifest
    skipped: tuple[dict, ...]

    @property
    def digest(self) -> str:
        return bundle_digest(self.manifest)

    def to_dict(self) -> dict:
        m = self.manifest
        return {"path": str(self.path), "digest": self.digest, "size": self.path.stat().st_size, "gpu": m.target.gpu,
                "kernels": len(m.kernels), "modules": len(m.modules),
                "flashinfer": [{"name": f.name, "archs": list(f.archs)} for f in m.flashinfer],
                "skipped": list(self.skipped)}


def make_bundle(output: str | os.PathLike, entries: list[Entry], target: Target, environment: Environment,
                build: Build, flashinfer: tuple[tuple[FlashInferModule, list], ...] = (),
                triton_identity: TritonIdentity | None = None, frames: Frames | None = None,
                walks: dict | None = None, engine: tuple[Member, ...] = ()) -> PackResult:
    """Hash every member, write the manifest and the bundle. ``flashinfer``: (module, members) pairs;
    ``triton_identity``: the Triton that compiled the entries, by content (format/identity.py); ``frames``: where
    compressed bundles are kept (buildcache/frames.py); ``walks``: the record of Triton's dependency walks of the
    build's ``@jit`` functions (hooks/kernelcache_walks.py ``walk_records``)."""
    readers, records = {}, {}
    for entry in entries:
        records[entry.key] = [_record(m.path, m.read(), readers, m) for m in entry.members]
    kernels, modules = to_manifest_entries(entries, records)
    fi_modules = []
    for module, members in flashinfer:
        files = tuple(_record(m.path, m.read(), readers, m) for m in members)
        fi_modules.append(FlashInferModule(**{**module.__dict__, "files": files}))
    walked = None
    if walks and walks.get("functions"):
        member = walks_member(walks)
        walked = TritonWalks((_record(member.path, member.read(), readers, member),))
    compiled = EngineCompile(tuple(_record(m.path, m.read(), readers, m) for m in engine)) if engine else None
    manifest = Manifest(target=target, environment=environment, build=build, kernels=tuple(kernels),
                        modules=tuple(modules), flashinfer=tuple(fi_modules), triton_identity=triton_identity,
                        walks=walked, engine=compiled)
    path = write(output, manifest, readers.items(), frames=frames)
    return PackResult(path, manifest, build.skipped)


def _record(path: str, data: bytes, readers: dict, member) -> FileRecord:
    readers[path] = member.read
    return FileRecord(path, len(data), hashlib.sha256(data).hexdigest())


def pack(cache_dir: str | os.PathLike, output: str | os.PathLike, keep_ir: bool = False,
         compile_log: str | None = None, arch: str | None = None) -> PackResult:
    """Bundle an existing Triton cache directory, as filled by any run of this Triton."""
    compiles = ExerciseLog.read([compile_log]).compiles if compile_log else ()
    found = harvest(cache_dir, compiles=compiles, keep_ir=keep_ir)
    entries, skipped = _select_arch(found, arch, Path(cache_dir))
    if not any(e.kind == "kernel" for e in entries):
        raise UsageError(f"{cache_dir} holds no complete Triton kernel to pack")
    capability = _capability(entries, Path(cache_dir))
    target = Target(backend="cuda", arch=capability_to_arch(capability))
    environment = local_environment([target.arch])
    _check_triton_version(entries, Path(cache_dir), environment)
    build = Build(tool=f"kernelcache {__version__}", mode="pack", source_date_epoch=source_date_epoch(),
                  keep_ir=keep_ir, skipped=tuple(skipped))
    return make_bundle(output, entries, target, environment, build, triton_identity=identity_here([target.arch]))


def _metadata(entry: Entry, root: Path) -> dict:
    return json.loads((root / entry.key / f"{entry.info['name']}.json").read_text())


def _select_arch(found: Harvest, arch: str | None, root: Path) -> tuple[list[Entry], list[dict]]:
    entries, skipped = [], list(found.skipped)
    archs = {e.key: _metadata(e, root)["target"]["arch"] for e in found.kernels}
    wanted = flag_capability(arch) if arch else None
    if wanted is None and len(set(archs.values())) > 1:
        listed = ", ".join(sorted({capability_to_arch(a) for a in archs.values()}))
        raise UsageError(f"the cache holds kernels for several archs ({listed}); pick one with --arch")
    for entry in found.entries:
        if entry.kind == "kernel" and wanted is not None and archs[entry.key] != wanted:
            skipped.append({"path": entry.key, "reason": f"kernel for sm_{archs[entry.key]}, not {arch}"})
        else:
            entries.append(entry)
    return entries, skipped


def _capability(entries: list[Entry], root: Path) -> int:
    return next(_metadata(e, root)["target"]["arch"] for e in entries if e.kind == "kernel")


def _check_triton_version(entries: list[Entry], root: Path, environment: Environment) -> None:
    versions = {_metadata(e, root).get("triton_version") for e in entries if e.kind == "kernel"}
    versions.discard(None)
    if versions and versions != {environment.triton}:
        raise UsageError(
            f"the cache was filled by triton {', '.join(sorted(versions))} but this interpreter has triton "
            f"{environment.triton}; run pack with the Python that filled the cache"
        )
