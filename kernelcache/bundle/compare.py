"""Compare two bundles (``diff``) and combine two bundles of one environment (``merge``).

A diff lists what differs between bundle A and bundle B: target fields, environment fields
(the fingerprint: everything a Triton cache key depends on, plus torch for the reader), kernels
(by name), their variants (one per cache key) and the prebuilt modules. Only manifests are read,
so a diff of two large bundles costs two small reads.

A merge refuses, with ``MergeConflict``, bundles whose fingerprints or targets differ (their
kernels would not hit in one environment) and cache keys whose bytes differ between A and B (one
of them would silently win). Otherwise the members of both, verified, go into one new bundle. Autotune
choices (``kernelcache tune``) come along from the side that has them; two sides that both have choices
merge only when they were timed on the same GPU, driver and clocks (one record stamps them all).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import MergeConflict, UsageError
from ..format.archive import bundle_digest, extract, read_manifest, source_date_epoch, write
from ..format.manifest import (
    AUTOTUNE_SUFFIX,
    Build,
    Environment,
    FlashInferModule,
    Kernel,
    Manifest,
    Module,
    TritonWalks,
    Tuning,
)
from ..version import __version__

# Environment fields that pick cache keys or kernel sources; torch is recorded but in no key.
FINGERPRINT_FIELDS = ("python", "platform", "triton", "triton_key_sha256", "ptxas", "env_vars", "vllm", "flashinfer")


def fingerprint(environment: Environment) -> str:
    """sha256 over the fields that must be equal for a bundle's kernels to hit."""
    fields = {name: getattr(environment, name) for name in FINGERPRINT_FIELDS}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class FieldChange:
    field: str  # "target.arch", "environment.ptxas[sm_90]", "environment.env_vars[TRITON_X]"
    a: str | None
    b: str | None
    blocking: bool  # False for fields in no cache key (torch)


@dataclass(frozen=True)
class EntryChange:
    """A kernel variant, module or FlashInfer module present on one side only, or different."""

    change: str  # "added" (only in B) | "removed" (only in A) | "changed" (same key, other bytes)
    kind: str  # "kernel" | "launcher" | "cuda_utils" | "other" | "flashinfer"
    name: str
    key: str
    detail: str = ""


@dataclass(frozen=True)
class BundleDiff:
    a: Manifest
    b: Manifest
    target: tuple[FieldChange, ...]
    environment: tuple[FieldChange, ...]
    entries: tuple[EntryChange, ...]

    @property
    def digests(self) -> tuple[str, str]:
        return bundle_digest(self.a), bundle_digest(self.b)

    @property
    def same_fingerprint(self) -> bool:
        return not any(c.blocking for c in self.environment)

    @property
    def identical(self) -> bool:
        return not (self.target or self.environment or self.entries)

    @property
    def kernels_added(self) -> tuple[str, ...]:
        return _only(self.b, self.a)

    @property
    def kernels_removed(self) -> tuple[str, ...]:
        return _only(self.a, self.b)

    def count(self, change: str, kind: str = "kernel") -> int:
        return sum(1 for e in self.entries if e.change == change and e.kind == kind)

    def to_dict(self) -> dict:
        digest_a, digest_b = self.digests
        return {
            "a": {"digest": digest_a, "arch": self.a.target.arch, "kernels": len(self.a.kernels)},
            "b": {"digest": digest_b, "arch": self.b.target.arch, "kernels": len(self.b.kernels)},
            "identical": self.identical,
            "same_fingerprint": self.same_fingerprint,
            "fingerprints": [fingerprint(self.a.environment), fingerprint(self.b.environment)],
            "target": [dataclasses.asdict(c) for c in self.target],
            "environment": [dataclasses.asdict(c) for c in self.environment],
            "kernels_added": list(self.kernels_added),
            "kernels_removed": list(self.kernels_removed),
            "entries": [dataclasses.asdict(e) for e in self.entries],
        }


def diff(a: str | os.PathLike, b: str | os.PathLike) -> BundleDiff:
    """What differs between bundle A and bundle B (B relative to A)."""
    return diff_manifests(read_manifest(a), read_manifest(b))


def diff_manifests(a: Manifest, b: Manifest) -> BundleDiff:
    target = tuple(_changes("target", dataclasses.asdict(a.target), dataclasses.asdict(b.target)))
    environment = tuple(environment_changes(a.environment, b.environment))
    entries = (*_kernel_changes(a.kernels, b.kernels), *_module_changes(a.modules, b.modules),
               *_flashinfer_changes(a.flashinfer, b.flashinfer), *_choice_changes(a.tuning, b.tuning))
    return BundleDiff(a, b, target, environment, tuple(entries))


def environment_changes(a: Environment, b: Environment) -> list[FieldChange]:
    """Every environment field that differs, dict fields (ptxas, env_vars) key by key."""
    changes = _changes("environment", dataclasses.asdict(a), dataclasses.asdict(b))
    return [dataclasses.replace(c, blocking=c.field != "environment.torch") for c in changes]


def _changes(prefix: str, a: dict, b: dict) -> list[FieldChange]:
    changes = []
    for name in a:
        left, right = a[name], b[name]
        if isinstance(left, dict) and isinstance(right, dict):
            for key in sorted(set(left) | set(right)):
                if left.get(key) != right.get(key):
                    changes.append(FieldChange(f"{prefix}.{name}[{key}]", _text(left.get(key)),
                                               _text(right.get(key)), True))
        elif left != right:
            changes.append(FieldChange(f"{prefix}.{name}", _text(left), _text(right), True))
    return [_first_line_that_differs(c) for c in changes]


def _text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _first_line_that_differs(change: FieldChange) -> FieldChange:
    """Multi-line values (``ptxas --version``) shown by their first differing line."""
    if not (change.a and change.b and ("\n" in change.a or "\n" in change.b)):
        return change
    for x, y in zip(change.a.splitlines(), change.b.splitlines()):
        if x != y:
            return dataclasses.replace(change, a=x, b=y)
    return change


def describe(kernel: Kernel) -> str:
    """One variant in a line: what specialises it (warps, stages, constexprs, types, ``%16`` alignment)."""
    parts = [f"num_warps={kernel.num_warps}", f"num_stages={kernel.num_stages}"]
    for name, value in (kernel.constexprs or {}).items():
        parts.append(f"{name}={value}")
    attrs = kernel.attrs or {}
    for name, kind in (kernel.signature or {}).items():
        if kind != "constexpr":
            divisible = any(a[:1] == ["tt.divisibility"] for a in attrs.get(name, ()) if isinstance(a, list))
            parts.append(f"{name}:{kind}" + ("%16" if divisible else ""))
    return " ".join(parts)


def _kernel_changes(a: Iterable[Kernel], b: Iterable[Kernel]) -> list[EntryChange]:
    left, right = {k.key: k for k in a}, {k.key: k for k in b}
    changes = []
    for key in sorted(set(left) | set(right), key=lambda k: ((left.get(k) or right.get(k)).name, k)):
        kernel = left.get(key) or right[key]
        if key not in right:
            changes.append(EntryChange("removed", "kernel", kernel.name, key, describe(kernel)))
        elif key not in left:
            changes.append(EntryChange("added", "kernel", kernel.name, key, describe(kernel)))
        elif left[key].files != right[key].files:
            changes.append(EntryChange("changed", "kernel", kernel.name, key, _files_detail(left[key], right[key])))
    return changes


def _module_changes(a: Iterable[Module], b: Iterable[Module]) -> list[EntryChange]:
    left, right = {m.key: m for m in a}, {m.key: m for m in b}
    changes = []
    for key in sorted(set(left) | set(right)):
        module = left.get(key) or right[key]
        name = ",".join(os.path.basename(f.path) for f in module.files)
        if key not in right:
            changes.append(EntryChange("removed", module.kind, name, key))
        elif key not in left:
            changes.append(EntryChange("added", module.kind, name, key))
        elif left[key].files != right[key].files:
            changes.append(EntryChange("changed", module.kind, name, key, _files_detail(left[key], right[key])))
    return changes


def _flashinfer_changes(a: Iterable[FlashInferModule], b: Iterable[FlashInferModule]) -> list[EntryChange]:
    left, right = {m.name: m for m in a}, {m.name: m for m in b}
    changes = []
    for name in sorted(set(left) | set(right)):
        module = left.get(name) or right[name]
        detail = f"flashinfer {module.version}, CUDA {module.cuda}, {' '.join(module.archs)}"
        if name not in right:
            changes.append(EntryChange("removed", "flashinfer", name, name, detail))
        elif name not in left:
            changes.append(EntryChange("added", "flashinfer", name, name, detail))
        elif left[name] != right[name]:
            changes.append(EntryChange("changed", "flashinfer", name, name, _files_detail(left[name], right[name])))
    return changes


def _choice_changes(a: Tuning | None, b: Tuning | None) -> list[EntryChange]:
    """Autotune files on one side only, or with other bytes (kind ``autotune``, detail: where they were timed)."""
    left = {f.path: f for f in a.files} if a else {}
    right = {f.path: f for f in b.files} if b else {}
    changes = []
    for path in sorted(set(left) | set(right)):
        key, _, name = path.partition("/")
        kernel = name.removesuffix(AUTOTUNE_SUFFIX)
        if path not in right:
            changes.append(EntryChange("removed", "autotune", kernel, key, f"timed on {a.where()}"))
        elif path not in left:
            changes.append(EntryChange("added", "autotune", kernel, key, f"timed on {b.where()}"))
        elif left[path] != right[path] or a.where() != b.where():
            changes.append(EntryChange("changed", "autotune", kernel, key, f"timed on {a.where()} vs {b.where()}"))
    return changes


def _files_detail(a, b) -> str:
    left, right = {f.path: f for f in a.files}, {f.path: f for f in b.files}
    differing = sorted(p for p in set(left) | set(right) if left.get(p) != right.get(p))
    return "different bytes: " + ", ".join(os.path.basename(p) for p in differing)


def _only(x: Manifest, y: Manifest) -> tuple[str, ...]:
    return tuple(sorted({k.name for k in x.kernels} - {k.name for k in y.kernels}))


# -- merge ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeResult:
    path: Path
    manifest: Manifest
    sources: tuple[str, str]  # bundle digests of A and B
    added: int  # kernel variants B contributed that A lacked
    warnings: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        return bundle_digest(self.manifest)

    def to_dict(self) -> dict:
        return {"path": str(self.path), "digest": self.digest, "sources": list(self.sources), "added": self.added,
                "kernels": len(self.manifest.kernels), "modules": len(self.manifest.modules),
                "warnings": list(self.warnings)}


def merge(a: str | os.PathLike, b: str | os.PathLike, output: str | os.PathLike) -> MergeResult:
    """One bundle with every kernel and module of A and B. Refuses what would not be one cache."""
    left, right = read_manifest(a), read_manifest(b)
    manifest, warnings = merge_manifests(left, right)
    if not Path(output).parent.is_dir():
        raise UsageError(f"cannot write {output}: {Path(output).parent} is not a directory")
    with tempfile.TemporaryDirectory(prefix=".kernelcache-merge-", dir=Path(output).parent) as work:
        roots = (Path(work) / "a", Path(work) / "b")
        extract(a, roots[0])  # verifies every member of A and B before anything is written
        extract(b, roots[1])
        sources = {f.path: roots[0] if (roots[0] / f.path).is_file() else roots[1] for f in manifest.files()}
        members = [(path, (lambda p=root / path: p.read_bytes())) for path, root in sources.items()]
        path = write(output, manifest, members)
    added = len({k.key for k in manifest.kernels} - {k.key for k in left.kernels})
    return MergeResult(path, manifest, (bundle_digest(left), bundle_digest(right)), added, tuple(warnings))


def merge_manifests(a: Manifest, b: Manifest) -> tuple[Manifest, list[str]]:
    """The merged manifest, or ``MergeConflict`` naming the first reason it cannot exist."""
    if a.target != b.target:
        fields = [c.field for c in diff_manifests(a, b).target]
        raise MergeConflict(f"the bundles have different targets ({', '.join(fields)}: "
                            f"{_target_text(a)} vs {_target_text(b)}); merge bundles of one target only")
    changes = environment_changes(a.environment, b.environment)
    blocking = [c for c in changes if c.blocking]
    if blocking:
        shown = "; ".join(f"{c.field}: {c.a} vs {c.b}" for c in blocking[:3])
        raise MergeConflict(f"the bundles have different environment fingerprints ({len(blocking)} field(s) "
                            f"differ: {shown}); their kernels cannot hit in one environment")
    warnings = [f"{c.field}: {c.a} vs {c.b}; keeping A's (not part of any cache key)" for c in changes]
    kernels = _union("kernel", a.kernels, b.kernels, lambda k: k.key, _richer)
    modules = _union("module", a.modules, b.modules, lambda m: m.key)
    flashinfer = _union("FlashInfer module", a.flashinfer, b.flashinfer, lambda m: m.name)
    _check_paths_unique([*kernels, *modules, *flashinfer])
    build = Build(tool=f"kernelcache {__version__}", mode="merge",
                  source_date_epoch=source_date_epoch() or max(a.build.source_date_epoch, b.build.source_date_epoch),
                  keep_ir=a.build.keep_ir or b.build.keep_ir, plan={"merged_from": _sources(a, b)},
                  skipped=tuple(_dedupe([*a.build.skipped, *b.build.skipped])))
    identity = a.triton_identity if a.triton_identity == b.triton_identity else None  # else neither speaks for both
    merged = Manifest(target=a.target, environment=a.environment, build=build, kernels=kernels,
                      modules=modules, flashinfer=flashinfer, triton_identity=identity,
                      tuning=_merged_tuning(a.tuning, b.tuning), walks=_merged_walks(a.walks, b.walks))
    return merged, warnings


def _merged_walks(a: TritonWalks | None, b: TritonWalks | None) -> TritonWalks | None:
    """The walk records of both sides: each names its file by its digest, and a served process reads them all."""
    files = {f.path: f for side in (a, b) if side is not None for f in side.files}
    return TritonWalks(tuple(files[path] for path in sorted(files))) if files else None


def _merged_tuning(a: Tuning | None, b: Tuning | None) -> Tuning | None:
    """The choices of the side that has them, or of both sides when one GPU, driver and clocks timed them."""
    if a is None or b is None:
        return a or b
    if (a.product, a.driver, a.cuda, a.clocks) != (b.product, b.driver, b.cuda, b.clocks):
        raise MergeConflict(f"the bundles' autotune choices were timed on {a.where()} and on {b.where()}; a bundle "
                            "stamps its choices with one GPU: merge the untuned bundle into one of them instead")
    files = {f.path: f for f in a.files}
    for record in b.files:
        if files.setdefault(record.path, record) != record:
            raise MergeConflict(f"autotune choice {record.path} has different bytes in the two bundles; refusing to "
                                "pick one")
    return dataclasses.replace(a, files=tuple(files[path] for path in sorted(files)))


def _union(what: str, a, b, key, prefer=None) -> tuple:
    items = {key(x): x for x in a}
    for item in b:
        k = key(item)
        if k not in items:
            items[k] = item
        elif items[k].files != item.files:
            raise MergeConflict(f"{what} {getattr(item, 'name', k)} ({k}) has different bytes in the two bundles; "
                                "one build is not what the other says it is, refusing to pick one")
        elif prefer is not None:
            items[k] = prefer(items[k], item)
    return tuple(items[k] for k in sorted(items))


def _richer(a: Kernel, b: Kernel) -> Kernel:
    """Same key and bytes: keep the record that knows more (a compile log gives constexprs)."""
    return b if a.constexprs is None and b.constexprs is not None else a


def _check_paths_unique(items) -> None:
    seen: dict[str, str] = {}
    for item in items:
        for record in item.files:
            owner = getattr(item, "key", None) or item.name
            if seen.setdefault(record.path, owner) != owner:
                raise MergeConflict(f"member {record.path} belongs to two different entries")


def _sources(a: Manifest, b: Manifest) -> list[dict]:
    rows = [{"digest": bundle_digest(m), "mode": m.build.mode, "plan": m.build.plan, "coverage": m.build.coverage}
            for m in (a, b)]
    return sorted(rows, key=lambda r: r["digest"])


def _dedupe(rows: list[dict]) -> list[dict]:
    unique = {json.dumps(r, sort_keys=True): r for r in rows}
    return [unique[k] for k in sorted(unique)]


def _target_text(m: Manifest) -> str:
    t = m.target
    return f"{t.backend} {t.arch}" + (f" {t.gpu}/{t.sm_count} SMs" if t.gpu or t.sm_count else "")
