"""``kernelcache verify``: run the bundle's vLLM paths against an installed cache, count compiles.

The claim we sell is "after install, vLLM's sampler compiles nothing". ``verify`` measures it: fresh
exercise processes with the installed cache as ``TRITON_CACHE_DIR`` run the same paths the build ran
(really on a visible GPU of the arch; behind the fake target otherwise, so CI covers the logic), and
count every ``compile()`` with ``cache_hit=False``, every gcc build of a launcher or ``cuda_utils``, and
every file that appeared in the cache. Any of those fails the check -- except, with Triton >= 3.7,
the one build of its generic ``cuda_utils`` launcher: that module's cache key holds the Triton
install path and the libcuda dir (triton-cache.md "Launchers"), so no bundle can carry it for another
machine. It is reported under ``tolerated`` instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .build import BuildTarget, check_paths, exercise
from .bundle.archive import read_manifest
from .bundle.manifest import Manifest
from .errors import BundleManifestError, UsageError
from .exercise import listener
from .install import STATE_DIR, install, receipts, resolve_cache_dir
from .plan import manifest as plan_file
from .plan.gpus import GpuProfile, visible_gpus


@dataclass(frozen=True)
class KernelCount:
    name: str
    calls: int
    hits: int
    compiles: int


@dataclass(frozen=True)
class VerifyReport:
    cache_dir: Path
    mode: str
    arch: str
    kernels: tuple[KernelCount, ...]
    gcc_builds: tuple[str, ...]
    files_written: tuple[str, ...]
    seconds: float
    tolerated: tuple[str, ...] = ()

    @property
    def compiles(self) -> int:
        return sum(k.compiles for k in self.kernels)

    @property
    def hits(self) -> int:
        return sum(k.hits for k in self.kernels)

    @property
    def ok(self) -> bool:
        return self.compiles == 0 and not self.gcc_builds and not self.files_written

    def to_dict(self) -> dict:
        return {"ok": self.ok, "cache_dir": str(self.cache_dir), "mode": self.mode, "arch": self.arch,
                "compiles": self.compiles, "hits": self.hits, "gcc_builds": list(self.gcc_builds),
                "files_written": list(self.files_written), "tolerated": list(self.tolerated),
                "seconds": self.seconds,
                "kernels": [k.__dict__ for k in self.kernels]}


def verify(bundle: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
           manifest: str | os.PathLike | None = None, gpus: list[str] | None = None,
           vocabs: list[int] | None = None, dtypes: list[str] | None = None, max_num_seqs: int | None = None,
           paths: list[str] | None = None, mode: str = "auto", jobs: int | None = None) -> VerifyReport:
    """Install ``bundle`` (into ``cache_dir`` or a fresh temp dir) or take an installed cache, and check it."""
    scratch = Path(tempfile.mkdtemp(prefix="kernelcache-verify-"))
    try:
        if bundle is not None:
            bundle_manifest = read_manifest(bundle)
            root = Path(cache_dir) if cache_dir else scratch / "cache"
            install(bundle, root)
        else:
            root = resolve_cache_dir(cache_dir)
            bundle_manifest = _installed_manifest(root)
        plan = _plan(bundle_manifest, manifest, gpus, vocabs, dtypes, max_num_seqs, paths)
        check_paths(plan)
        target = _target(bundle_manifest, mode)
        return _check(plan, target, root, scratch / "work", jobs or os.cpu_count() or 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _installed_manifest(root: Path) -> Manifest:
    found = receipts(root)
    if not found:
        raise UsageError(f"{root} holds no installed bundle; give a bundle or install one first")
    try:
        return Manifest.from_dict(found[0]["manifest"])
    except BundleManifestError as exc:
        raise UsageError(f"{root}: the newest install receipt is unreadable ({exc})") from None


def _plan(bundle: Manifest, manifest, gpus, vocabs, dtypes, max_num_seqs, paths) -> plan_file.BuildPlan:
    """The plan the bundle was built with (flags or another manifest override it)."""
    if manifest is not None:
        plan = plan_file.load(manifest)
    elif "merged_from" in (bundle.build.plan or {}):
        raise UsageError("a merged bundle records no single build plan; pass --manifest (or the build flags) "
                         "for what it should cover")
    elif bundle.build.plan:
        try:
            plan = plan_file.BuildPlan.from_dict(bundle.build.plan)
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"the bundle's recorded build plan is unreadable ({exc}); pass --manifest") from None
    else:
        raise UsageError("the bundle records no build plan (it was packed, not built); pass --manifest or flags")
    plan = plan.override(gpus=gpus, vocabs=vocabs, dtypes=dtypes, max_num_seqs=max_num_seqs, paths=paths)
    return plan.override(paths=[p for p in plan.paths if p != "flashinfer"] or None)


def _target(bundle: Manifest, mode: str) -> BuildTarget:
    arch, sms = bundle.target.arch, bundle.target.sm_count
    if sms is None:
        raise UsageError("the bundle names no SM count; verify needs a bundle built for a GPU profile")
    local = [g for g in visible_gpus() if g.arch == arch and g.sm_count == sms] if mode != "cross" else []
    if mode == "native" and not local:
        raise UsageError(f"--mode native needs a visible {arch} GPU with {sms} SMs")
    run_native = bool(local) and mode in ("auto", "native")
    profile = GpuProfile(bundle.target.gpu or "bundle", arch, sms, local[0].name if local else "NVIDIA GPU")
    return BuildTarget(arch, sms, (profile,), "native" if run_native else "cross")


def _check(plan, target: BuildTarget, root: Path, work: Path, jobs: int) -> VerifyReport:
    before = _snapshot(root)
    started = time.perf_counter()
    _, records = exercise(plan, target, work, root, jobs)
    seconds = time.perf_counter() - started
    written = sorted(set(_snapshot(root)) - set(before))
    compiles = listener.compiles(records)
    calls, hits = Counter(r["name"] for r in compiles), Counter(r["name"] for r in compiles if r["cache_hit"])
    kernels = tuple(KernelCount(n, calls[n], hits[n], calls[n] - hits[n]) for n in sorted(calls))
    gcc = [r["name"] for r in records if r.get("event") == "gcc"]
    tolerated: list[str] = []
    if _generic_launcher():
        tolerated = [f"gcc build of {n} (Triton >= 3.7: keyed by install paths)" for n in gcc if n == "cuda_utils"]
        tolerated += [f for f in written if Path(f).name.startswith("cuda_utils")]
        gcc = [n for n in gcc if n != "cuda_utils"]
        written = [f for f in written if not Path(f).name.startswith("cuda_utils")]
    return VerifyReport(root, target.mode, target.arch, kernels, tuple(gcc), tuple(written), seconds,
                        tuple(tolerated))


def _generic_launcher() -> bool:
    """Triton >= 3.7 launches through one generic ``cuda_utils`` module, whose key holds machine paths."""
    from .bundle.fingerprint import package_version

    version = package_version("triton") or "0"
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor) >= (3, 7)


def _snapshot(root: Path) -> dict[str, int]:
    files = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if rel.parts[0] != STATE_DIR and path.is_file():
            files[str(rel)] = path.stat().st_size
    return files
