"""``kernelcache verify``: run the bundle's vLLM paths against an installed cache, count compiles.

The claim we sell is "after install, vLLM's sampler compiles nothing". ``verify`` measures it: fresh exercise
processes with the installed cache as ``TRITON_CACHE_DIR`` run the same paths the build ran (really on a
visible GPU of the arch; behind the fake target otherwise, so CI covers the logic), and count every
``compile()`` with ``cache_hit=False``, every gcc build of a launcher or ``cuda_utils``, and every file that
appeared in the cache. Any of those fails the check, except the autotune files Triton's autotuner writes as it
times candidates on a GPU (vLLM turns its autotune cache on): listed under ``tolerated``. The exercise
processes take helper modules from the cache as served ones do (hooks/kernelcache_prebuilt.py): a
module Triton keys differently for the same source (with Triton >= 3.7 ``cuda_utils``'s key hashes its include
and library dirs, the Triton install path and the libcuda dir; in 3.6 every key holds what file(1) says of the
interpreter) is copied from the bundle, and that copy is reported under ``tolerated``. So is, for a bundle
built before bundles recorded ``cuda_utils``'s source, Triton >= 3.7's one gcc build of it.

A bundled FlashInfer module is verified through FlashInfer itself, in a fresh interpreter with the
cache's environment (JIT disabled): its own lookup must resolve to the installed file and load it;
on a visible GPU of the module's arch one sampling call must run.

A check that ran nothing proves nothing: when the plan selects no exercise task and no FlashInfer
module, or the tasks asked for no kernel, the report says so and ``failure()`` is ``NothingVerified``.
Every bundled kernel no task asked for is listed under ``unexercised``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .cachedir import STATE_DIR, CacheDir
from .errors import (
    CompilesDetected,
    FlashInferUnverified,
    KernelcacheError,
    NothingVerified,
    NotInstalled,
    UsageError,
)
from .exercise.jobs import exercise
from .format.archive import read_manifest
from .format.fingerprint import device_note
from .format.manifest import AUTOTUNE_SUFFIX, FlashInferModule, Manifest, arch_to_capability
from .hooks import kernelcache_prebuilt
from .install import install
from .plan.gpus import GpuProfile, visible_gpus
from .plan.recipe import BuildPlan, PlanOverrides, load
from .plan.targets import BuildTarget, check_paths
from .plan.tasks import plan_units


@dataclass(frozen=True)
class KernelCount:
    name: str
    calls: int
    hits: int
    compiles: int


@dataclass(frozen=True)
class BundledKernel:
    """A kernel variant the bundle holds (``name`` at cache key ``key``)."""

    name: str
    key: str


@dataclass(frozen=True)
class FlashInferCheck:
    """One bundled FlashInfer module as FlashInfer itself saw it with JIT disabled.

    ``found``: FlashInfer's lookup resolved to files inside the installed cache; ``loaded``: it loaded
    the module; ``called``: one sampling call ran (only tried where ``on_gpu``).
    """

    name: str
    archs: tuple[str, ...]
    artifacts: tuple[str, ...]
    found: bool
    loaded: bool
    on_gpu: bool
    called: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.found and self.loaded and (self.called or not self.on_gpu)


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
    tasks: int = 0  # exercise tasks run
    unexercised: tuple[BundledKernel, ...] = ()  # bundled kernels no task asked for
    flashinfer: tuple[FlashInferCheck, ...] = ()
    device: str | None = None  # why the device name makes kernels miss (a bundle for another product)
    left_out: tuple[str, ...] = ()  # FlashInfer modules the build left out, each with its reason
    engine: tuple[str, ...] = ()  # vLLM's compile artifacts whose hash vLLM computes here (enginecompile.check)

    @property
    def compiles(self) -> int:
        return sum(k.compiles for k in self.kernels)

    @property
    def hits(self) -> int:
        return sum(k.hits for k in self.kernels)

    @property
    def nothing_verified(self) -> bool:
        """No kernel was asked for and no FlashInfer module checked: an ok here would prove nothing."""
        return not self.kernels and not self.flashinfer and not self.engine

    @property
    def ok(self) -> bool:
        return self.failure() is None

    def failure(self) -> KernelcacheError | None:
        """The error this report amounts to, or None when the cache passed."""
        if self.compiles or self.gcc_builds or self.files_written:
            why = f" ({self.device})" if self.device else ""
            return CompilesDetected(f"{self.compiles} compile(s), {len(self.gcc_builds)} gcc build(s), "
                                    f"{len(self.files_written)} new file(s) in {self.cache_dir}{why}")
        bad = [c for c in self.flashinfer if not c.ok]
        if bad:
            return FlashInferUnverified(f"FlashInfer module {bad[0].name}: {_fi_problem(bad[0], self.cache_dir)}")
        if self.nothing_verified and self.left_out:
            return NothingVerified(f"nothing was verified: the bundle holds no kernel or module its plan asks for; the "
                                   f"build left out {'; '.join(self.left_out)}")
        if self.nothing_verified:
            return NothingVerified(f"nothing was verified: the plan ran {self.tasks} exercise task(s), which asked for "
                                   f"no kernel, and checked no FlashInfer module; {len(self.unexercised)} bundled "
                                   "kernel(s) unexercised (check --path and --dtype: registry and mrv1 need float32)")
        return None

    def to_dict(self) -> dict:
        return {"ok": self.ok, "cache_dir": str(self.cache_dir), "mode": self.mode, "arch": self.arch,
                "compiles": self.compiles, "hits": self.hits, "gcc_builds": list(self.gcc_builds),
                "files_written": list(self.files_written), "tolerated": list(self.tolerated),
                "seconds": self.seconds, "tasks": self.tasks, "nothing_verified": self.nothing_verified,
                "device": self.device, "left_out": list(self.left_out), "engine": list(self.engine),
                "kernels": [asdict(k) for k in self.kernels],
                "unexercised": [asdict(k) for k in self.unexercised],
                "flashinfer": [{**asdict(c), "ok": c.ok} for c in self.flashinfer]}


def _fi_problem(check: FlashInferCheck, root: Path) -> str:
    if not check.found:
        where = ", ".join(check.artifacts) or "nothing"
        return f"FlashInfer's lookup resolved to {where}, not a file in {root}" + (
            f" ({check.error})" if check.error else "")
    if not check.loaded:
        return f"not loaded ({check.error})"
    return f"not callable on the GPU ({check.error})"


def verify(bundle: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
           recipe: str | os.PathLike | None = None, overrides: PlanOverrides | None = None, *, mode: str = "auto",
           jobs: int | None = None, **flags) -> VerifyReport:
    """Install ``bundle`` (into ``cache_dir`` or a fresh temp dir) or take an installed cache, and check it.

    The plan is the one the bundle was built with, or ``recipe``'s; ``overrides`` (or the fields of
    ``PlanOverrides`` as keywords) change it as ``build``'s flags do. The report's ``failure()`` says
    whether the cache passed (the CLI exits with its code)."""
    scratch = Path(tempfile.mkdtemp(prefix="kernelcache-verify-"))
    try:
        if bundle is not None:
            bundle_manifest = read_manifest(bundle)
            root = Path(cache_dir) if cache_dir else scratch / "cache"
            install(bundle, root)
        else:
            root = CacheDir.at(cache_dir).root
            bundle_manifest = _installed_manifest(root)
        engine = _engine(bundle_manifest, root, checked=bundle is not None)
        plan = recorded_plan(bundle_manifest, recipe, overrides or PlanOverrides.of(**flags))
        plan = replace(plan, paths=tuple(p for p in plan.paths if p != "compile"))
        report = _verify_plan(plan, bundle_manifest, root, scratch / "work", mode, jobs or os.cpu_count() or 1)
        return replace(report, engine=engine)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _engine(manifest: Manifest, root: Path, checked: bool) -> tuple[str, ...]:
    """The AOT directories of the bundle's compile artifacts, each checked against vLLM's hash here (refused with
    exit 23 naming the differing factor) unless its install just did; ``NotInstalled`` when a file of them is not in
    the cache dir (an install cut short before kernelcache published them before the receipt: install it again)."""
    from .cachedir.vllm_tree import absent
    from .enginecompile import check, records_of

    missing = absent(root, manifest) if manifest.engine is not None else []
    if missing:
        raise NotInstalled(f"the bundle's vLLM compile artifact is not installed whole in {root}: {len(missing)} "
                           f"file(s) missing, {missing[0]} first; install the bundle again, which puts them back")
    out = []
    for record_path, _ in records_of(manifest.files()):
        record = json.loads((root / record_path).read_text())
        if not checked:
            check(record)
        out.append(record["hash_dir"])
    return tuple(out)


def _verify_plan(plan: BuildPlan, bundle: Manifest, root: Path, work: Path, mode: str,
                 jobs: int) -> VerifyReport:
    """The plan's Triton tasks (when it selects any), then the bundle's FlashInfer modules: its sampling module when
    the plan asks for it, and every JIT module of another name (the attention modules) always."""
    triton_plan = replace(plan, paths=tuple(p for p in plan.paths if p != "flashinfer"))
    started = time.perf_counter()
    if plan_units(triton_plan):
        check_paths(triton_plan)
        target = _target(bundle, mode, plan)
        report, asked = _check(triton_plan, target, root, work, jobs)
        report = replace(report, device=_device_note(bundle, target))
    else:
        report, asked = VerifyReport(root, "none", bundle.target.arch, (), (), (), 0.0), set()
    modules = [m for m in bundle.flashinfer if "flashinfer" in plan.paths or m.name != "sampling"]
    checks = tuple(_check_flashinfer(m, root, mode) for m in modules)
    unexercised = sorted((BundledKernel(k.name, k.key) for k in bundle.kernels if k.key not in asked),
                         key=lambda k: (k.name, k.key))
    left_out = tuple(f"{s['path'].removeprefix('flashinfer/')} ({s.get('reason', '')})" for s in bundle.build.skipped
                     if str(s.get("path", "")).startswith("flashinfer/"))
    return replace(report, seconds=time.perf_counter() - started, flashinfer=checks, unexercised=tuple(unexercised),
                   left_out=left_out)


def _installed_manifest(root: Path) -> Manifest:
    found = CacheDir(root).receipts()
    if not found:
        raise UsageError(f"{root} holds no installed bundle; give a bundle or install one first")
    return found[0].manifest


def recorded_plan(bundle: Manifest, recipe=None, overrides: PlanOverrides | None = None) -> BuildPlan:
    """The plan the bundle was built with (flags or another manifest override it).

    A bundle of FlashInfer modules only needs no plan: verify checks its modules."""
    if recipe is None and not bundle.build.plan and bundle.flashinfer and not bundle.kernels:
        plan = load().override(paths=["flashinfer"])
    elif recipe is not None or (overrides is not None and (overrides.serve or overrides.model_config)):
        from .build import planned  # a serve command: what the installed vLLM configures for it, as build does

        return planned(bundle.target.arch, recipe, overrides)
    elif "merged_from" in (bundle.build.plan or {}):
        raise UsageError("a merged bundle records no single build plan; pass --recipe (or the build flags) "
                         "for what it should cover")
    elif bundle.build.plan:
        try:
            plan = BuildPlan.from_dict(bundle.build.plan)
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"the bundle's recorded build plan is unreadable ({exc}); pass --recipe") from None
    else:
        raise UsageError("the bundle records no build plan (it was packed, not built); pass --recipe or flags")
    return plan.override(overrides)


def _target(bundle: Manifest, mode: str, plan: BuildPlan) -> BuildTarget:
    """Cross mode fakes the bundle's GPU profile, its product name included (vLLM picks tuned fused-MoE
    configs by device name)."""
    arch, sms = bundle.target.arch, bundle.target.sm_count
    if sms is None:
        raise UsageError("the bundle names no SM count; verify needs a bundle built for a GPU profile")
    local = [g for g in visible_gpus() if g.arch == arch and g.sm_count == sms] if mode != "cross" else []
    if mode == "native" and not local:
        raise UsageError(f"--mode native needs a visible {arch} GPU with {sms} SMs")
    run_native = bool(local) and mode in ("auto", "native")
    fitting = [p for p in plan.gpus if p.arch == arch and p.sm_count == sms]
    named = [p for p in fitting if p.name == bundle.target.gpu] or fitting  # the bundle's profile, else --gpu's
    product = local[0].name if local else (named[0].product if named else "NVIDIA GPU")
    profile = GpuProfile(named[0].name if named else bundle.target.gpu or "bundle", arch, sms, product)
    return BuildTarget(arch, sms, (profile,), "native" if run_native else "cross")


def _device_note(bundle: Manifest, target: BuildTarget) -> str | None:
    """Why kernels will miss when the device name verify runs under is one the bundle does not serve."""
    keys, device = bundle.device_keys, target.profiles[0].product
    if keys is None or keys.accepts(device):
        return None
    return f"{device_note(keys)}, not {device}"


def _check(plan, target: BuildTarget, root: Path, work: Path, jobs: int) -> tuple[VerifyReport, set[str]]:
    """Run the plan's tasks against ``root``; the report and the cache keys the tasks asked for."""
    before = _snapshot(root)
    started = time.perf_counter()
    run = exercise(plan, target, work, root, jobs, served=True)
    seconds = time.perf_counter() - started
    written = sorted(set(_snapshot(root)) - set(before))
    compiles = run.log.compiles
    calls, hits = Counter(r.name for r in compiles), Counter(r.name for r in compiles if r.cache_hit)
    kernels = tuple(KernelCount(n, calls[n], hits[n], calls[n] - hits[n]) for n in sorted(calls))
    gcc, copied = list(run.log.gcc_builds), set(run.log.prebuilt)
    tolerated = [f"{n}: the bundle's build, copied under this machine's key (no gcc)" for n in sorted(copied)]
    tolerated += [f for f in written if _module_name(f) in copied]
    written = [f for f in written if _module_name(f) not in copied]
    tolerated += [f"{f}: a choice Triton's autotuner timed and kept (no compile; kernelcache tune bundles them)"
                  for f in written if f.endswith(AUTOTUNE_SUFFIX)]
    written = [f for f in written if not f.endswith(AUTOTUNE_SUFFIX)]
    if _generic_launcher() and not kernelcache_prebuilt.Finder(str(root)).recorded().get("cuda_utils"):
        tolerated += [f"gcc build of {n} (Triton >= 3.7: keyed by install paths; this bundle records no source "
                      "to take the bundle's for it)" for n in gcc if n == "cuda_utils"]
        tolerated += [f for f in written if _module_name(f) == "cuda_utils"]
        gcc = [n for n in gcc if n != "cuda_utils"]
        written = [f for f in written if _module_name(f) != "cuda_utils"]
    report = VerifyReport(root, target.mode, target.arch, kernels, tuple(gcc), tuple(written), seconds,
                          tuple(tolerated), tasks=run.tasks)
    return report, {r.key for r in compiles}


def _check_flashinfer(module: FlashInferModule, root: Path, mode: str) -> FlashInferCheck:
    """FlashInfer's own lookup and load of ``module`` from ``root`` in a fresh interpreter, JIT disabled."""
    from .exercise.flashinfer_probe import KNOWN
    from .runtime import flashinfer_env as fi_runtime

    on_gpu = mode != "cross" and _gpu_for(module) and module.name in KNOWN  # a URI module is loaded, not called
    env = {**os.environ, **fi_runtime.environment(root), "FLASHINFER_DISABLE_JIT": "1"}
    command = [sys.executable, "-m", "kernelcache.exercise.flashinfer_probe", module.name]
    if on_gpu:
        command.append("--call")
    else:
        env["FLASHINFER_CUDA_ARCH_LIST"] = _arch_list(module.archs[0])  # stands in for the GPU's arch
        libcudart = _cuda_runtime()
        if libcudart:
            command += ["--libcudart", libcudart]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    try:
        seen = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        seen = {"artifacts": [], "loaded": False, "error": f"the probe exited {done.returncode}: "
                f"{' '.join(done.stderr.split())[-500:]}"}
    artifacts = tuple(seen["artifacts"])
    found = bool(artifacts) and all(Path(a).resolve().is_relative_to(root.resolve()) for a in artifacts)
    return FlashInferCheck(module.name, tuple(module.archs), artifacts, found, bool(seen["loaded"]), on_gpu,
                           bool(seen.get("called")), seen.get("error"))


def _gpu_for(module: FlashInferModule) -> bool:
    wanted = {arch_to_capability(a) for a in module.archs}
    return any(g.capability in wanted for g in visible_gpus())


def _arch_list(arch: str) -> str:
    """``sm90a`` -> ``9.0a``: how ``FLASHINFER_CUDA_ARCH_LIST`` names an arch."""
    capability = arch_to_capability(arch)
    suffix = arch[-1] if arch[-1] in "af" else ""
    return f"{capability // 10}.{capability % 10}{suffix}"


def _cuda_runtime() -> str | None:
    """A CUDA runtime library to load the module with where torch brings none (CPU-only torch)."""
    from .exercise.flashinfer_sampling import find_toolchain

    try:
        path = find_toolchain().root / "lib" / "libcudart.so.13"
    except KernelcacheError:
        return None
    return str(path) if path.exists() else None


def _module_name(path: str) -> str:
    """``<key>/cuda_utils.cpython-312-x86_64-linux-gnu.so`` -> ``cuda_utils``."""
    return Path(path).name.split(".")[0]


def _generic_launcher() -> bool:
    """Triton >= 3.7 launches through one generic ``cuda_utils`` module, whose key holds machine paths."""
    from .format.fingerprint import package_version

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
