"""Real bundles that differ in known ways, made from the session's real compiled caches."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

from kernelcache.format import archive
from kernelcache.format.manifest import FileRecord

from .common import kc


def pack(cache: Path, out: Path, log: Path | None = None) -> Path:
    args = ["pack", str(cache), "-o", str(out)] + (["--compile-log", str(log)] if log else [])
    kc(*args, check=True)
    return out


def pack_without(cache: Path, log: Path, out: Path, names: set[str], work: Path) -> Path:
    """Pack a copy of ``cache`` from which every variant of the kernels ``names`` was removed."""
    copy = work / f"cache-without-{'-'.join(sorted(names))}"
    shutil.copytree(cache, copy)
    for entry in copy.iterdir():
        if entry.is_dir() and any((entry / f"__grp__{n}.json").exists() for n in names):
            shutil.rmtree(entry)
    return pack(copy, out, log)


def split(bundle: Path, out: Path, kernels: slice, modules: slice) -> Path:
    """A valid bundle holding the kernels and modules of ``bundle`` the two slices pick."""
    manifest = archive.read_manifest(bundle)
    part = dataclasses.replace(manifest, kernels=manifest.kernels[kernels], modules=manifest.modules[modules])
    keep = {f.path for f in part.files()}
    data = {n: d for _, n, d in archive.iter_members(bundle) if n in keep}
    return archive.write(out, part, [(n, lambda d=d: d) for n, d in data.items()])


def rewrite(bundle: Path, out: Path, target: dict | None = None, **environment) -> Path:
    """The same members under a manifest whose target or environment says something else (another
    ``triton_key_sha256``: another Triton, whose identity record this bundle cannot have, so none)."""
    manifest = archive.read_manifest(bundle)
    manifest = dataclasses.replace(
        manifest,
        target=dataclasses.replace(manifest.target, **(target or {})),
        environment=dataclasses.replace(manifest.environment, **environment),
        triton_identity=None if "triton_key_sha256" in environment else manifest.triton_identity,
    )
    data = {name: blob for _, name, blob in archive.iter_members(bundle)}
    archive.write(out, manifest, [(name, lambda blob=blob: blob) for name, blob in data.items()])
    return out


def with_identity(bundle: Path, out: Path, identity) -> Path:
    """The same bundle with another ``triton_identity`` record (None: without one, as scripts/strip_identity.py)."""
    manifest = dataclasses.replace(archive.read_manifest(bundle), triton_identity=identity)
    data = {name: blob for _, name, blob in archive.iter_members(bundle)}
    archive.write(out, manifest, [(name, lambda blob=blob: blob) for name, blob in data.items()])
    return out


def tamper(bundle: Path, out: Path, kernel_name: str) -> tuple[Path, str]:
    """A valid bundle whose first ``kernel_name`` variant has other cubin bytes under the same key."""
    manifest = archive.read_manifest(bundle)
    data = {name: blob for _, name, blob in archive.iter_members(bundle)}
    victim = next(k for k in manifest.kernels if k.name == kernel_name)
    cubin = next(f for f in victim.files if f.path.endswith(".cubin"))
    data[cubin.path] = data[cubin.path] + b"\0"
    record = FileRecord(cubin.path, len(data[cubin.path]), hashlib.sha256(data[cubin.path]).hexdigest())
    files = tuple(record if f.path == cubin.path else f for f in victim.files)
    kernels = tuple(dataclasses.replace(k, files=files) if k.key == victim.key else k for k in manifest.kernels)
    archive.write(out, dataclasses.replace(manifest, kernels=kernels),
                  [(name, lambda blob=blob: blob) for name, blob in data.items()])
    return out, victim.key


def engine_bundle(out: Path, hash_dir: str, command: str, record: dict | None = None, **environment) -> Path:
    """A bundle of one vLLM compile artifact (enginecompile.py's two members: its record and vLLM's
    ``torch_compile_cache`` tree as a tar) whose AOT directory ``hash_dir`` holds stand-in bytes: installing (forced:
    vLLM's hash check needs vLLM) and removing never loads it. ``record``: more of the record (the versions it pins);
    ``environment``: fingerprint fields to change."""
    import json

    from kernelcache import __version__
    from kernelcache.bundle.make import make_bundle
    from kernelcache.enginecompile import RECORD, ROOT, TREE, _tar
    from kernelcache.format.fingerprint import local_environment
    from kernelcache.format.manifest import Build, Member, Target

    folder = out.parent / f"{out.name}.tree" / "torch_compile_cache"
    model = folder / "torch_aot_compile" / hash_dir / "rank_0_0" / "model"
    model.parent.mkdir(parents=True)
    model.write_bytes(command.encode() * 3000)
    data = json.dumps({"command": command, "hash_dir": hash_dir, **(record or {})}, sort_keys=True).encode()
    tag = hashlib.sha256(data).hexdigest()[:16]
    members = (Member(f"{ROOT}/{tag}/{RECORD}", data=data), Member(f"{ROOT}/{tag}/{TREE}", data=_tar(folder)))
    fingerprint = dataclasses.replace(local_environment(["sm_90"]), **environment)
    make_bundle(out, [], Target("cuda", "sm_90"), fingerprint, Build(tool=f"kernelcache {__version__}", mode="cross"),
                engine=members)
    return out
