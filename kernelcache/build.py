"""``kernelcache build``: plan -> exercise -> harvest -> bundle, for one GPU arch. This module only wires the steps.

1. The recipe (plan/recipe.py) and the flags (``PlanOverrides``) give a ``BuildPlan``.
2. plan/targets.py groups the plan's GPU profiles of the arch by SM count (profiles with the same arch
   and SM count compile identical keys) into ``BuildTarget``s.
3. For each target, exercise/jobs.py runs one exercise process per vocab size (the tasks of
   plan/tasks.py) into one fresh ``TRITON_CACHE_DIR`` -- natively when a GPU of that arch is visible,
   otherwise behind the fake target -- ``--jobs`` at a time, and hands back typed results and log.
4. harvest.py reads the cache with that log; bundle/make.py writes one bundle per GPU profile, with
   the plan, the coverage (which specializations of which kernel each path produced) and the
   environment fingerprint; with ``sign``, bundle/signature.py signs each (``B.tar.zst.sig`` beside it).

With a build cache (buildcache/__init__.py; on by default) the exercise processes take every key an earlier
build compiled from it and publish what they compile to it, and a cross build restores a unit's exercise record
instead of running its process (buildcache/exercises.py). Targets that differ only by product run at once, a
unit they share running once. The bundles are the same bytes either way, and each ``TargetResult`` counts what
was reused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .buildcache import BuildCacheCounts, BuildCacheSpec, for_one_build
from .buildcache import check as check_build_cache
from .buildcache import resolve as resolve_build_cache
from .bundle.make import PackResult, make_bundle
from .bundle.signature import SigningKey, SignResult, load_signing_key
from .bundle.signature import sign as sign_bundle
from .errors import BuildFailed, RecipeError, UsageError
from .exercise.jobs import WorkerResult, exercise, flashinfer_jit_module, stop_exercises
from .format.archive import source_date_epoch
from .format.compilelog import CompileRecord
from .format.fingerprint import local_environment
from .format.identity import identity_here
from .format.manifest import (
    Build,
    DeviceKeys,
    DeviceTable,
    Environment,
    Target,
    TritonIdentity,
    capability_to_arch,
    flag_capability,
)
from .format.manifest import identity_record as manifest_identity
from .harvest import harvest
from .plan import families
from .plan.gpus import GpuProfile, visible_gpus
from .plan.recipe import BuildPlan, PlanOverrides, load, serve_request
from .plan.serve import ServeConfig
from .plan.targets import BuildTarget, plan_targets
from .plan.tasks import Task
from .preflight import IMPORTABLE, preflight, remember_imports
from .version import __version__


@dataclass(frozen=True)
class TargetResult:
    target: BuildTarget
    bundles: tuple[PackResult, ...]
    seconds: float
    compile_seconds: float
    compiles: int
    coverage: dict
    skipped: tuple[dict, ...] = ()
    signatures: tuple[SignResult, ...] = ()  # with ``build(sign=...)``: one per bundle
    build_cache: BuildCacheCounts = field(default_factory=BuildCacheCounts)  # what the build cache gave and took

    def to_dict(self) -> dict:
        return {"arch": self.target.arch, "sm_count": self.target.sm_count, "mode": self.target.mode,
                "seconds": self.seconds, "compiles": self.compiles, "compile_seconds": self.compile_seconds,
                "reused": self.build_cache.reused, "build_cache": self.build_cache.to_dict(),
                "coverage": self.coverage, "bundles": [_bundle_dict(b) for b in self.bundles],
                "signatures": [s.to_dict() for s in self.signatures]}


def _bundle_dict(bundle: PackResult) -> dict:
    return {k: v for k, v in bundle.to_dict().items() if k != "skipped"}


@dataclass(frozen=True)
class BuildResult:
    plan: BuildPlan
    targets: tuple[TargetResult, ...] = field(default_factory=tuple)

    @property
    def bundles(self) -> list[PackResult]:
        return [b for t in self.targets for b in t.bundles]

    def to_dict(self) -> dict:
        return {"plan": self.plan.to_dict(), "targets": [t.to_dict() for t in self.targets]}


def build(arch: str, recipe: str | os.PathLike | None = None, overrides: PlanOverrides | None = None, *,
          mode: str = "auto", jobs: int | None = None, output_dir: str | os.PathLike = "bundles",
          keep_ir: bool = False, workdir: str | os.PathLike | None = None, extra_tasks: tuple[Task, ...] = (),
          progress: Callable[[str, int, int], None] | None = None, from_misses: list[str] | None = None,
          target_env: str | os.PathLike | None = None, sign: str | os.PathLike | None = None,
          build_cache: str | os.PathLike | bool | None = None,
          **flags) -> BuildResult:
    """Build one bundle per GPU profile of ``arch`` from a recipe (``overrides`` change its plan).

    ``flags``: the fields of ``PlanOverrides`` and the families' flags as keywords (``gpus=["h200"], paths=["mrv2"]``,
    ``gdn_prefill_backend="triton"``), for short.
    ``from_misses``: overlay miss logs (``kernelcache run --read-only``) whose misses for this arch are
    compiled again, so the next bundle covers them. ``target_env``: a fingerprint file of the serving
    environment (``kernelcache fingerprint --json``); the build stops before compiling anything if
    ``install`` would refuse its bundles there. A cross build of FlashInfer's module fetches its CUDA
    toolchain first when none is here (exercise/flashinfer_sampling.py: ``ensure_toolchain``). ``sign``: a private key
    file that signs each bundle (``kernelcache sign``), read before anything is compiled. ``build_cache``: a
    directory or URL to take compiled kernels from and publish them to, False for none, None for the default
    (``KERNELCACHE_BUILD_CACHE``, else the user cache dir; buildcache/__init__.py).
    """
    arch = capability_to_arch(flag_capability(arch))
    signer = load_signing_key(sign) if sign is not None else None
    there = _load_target_env(target_env)
    plan = planned(arch, recipe, overrides or PlanOverrides.of(**flags))
    served = _served_locally(plan, recipe, overrides or PlanOverrides.of(**flags))
    cache = resolve_build_cache(build_cache)
    targets = plan_targets(plan, arch, mode, visible_gpus() if mode != "cross" else [])
    if there is not None:
        check_target_env(plan, targets, there, str(target_env), bool(extra_tasks or from_misses))
    check_build_cache(cache)
    preflight(plan, targets)  # before the Triton compiles: a broken environment fails in seconds, not minutes
    jobs = jobs or os.cpu_count() or 1
    out = Path(output_dir)
    made = _made_dirs(out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="kernelcache-build-"))
    keep = workdir is not None
    records = None

    def one(target: BuildTarget, slots: threading.Semaphore | None = None) -> TargetResult:
        work = scratch / target.label
        if work.exists():
            shutil.rmtree(work)
        tasks = tuple(extra_tasks) + _miss_tasks(from_misses or [], target.capability)
        return _signed(_build_target(plan, target, work, out, jobs, keep_ir, tasks, progress, cache, records,
                                     slots, served), signer)

    try:
        if cache is None and sum(t.mode == "cross" for t in targets) > 1:
            cache = for_one_build(scratch)  # the targets share units: what they use must be logged by key
            shutil.rmtree(cache.location, ignore_errors=True)  # a kept workdir's earlier build shares nothing
        records = _unit_records(cache, targets)
        results = _each_target(targets, one, jobs, records)
    except BaseException as exc:
        _remove_empty(made)
        if isinstance(exc, BuildFailed) and not keep:  # the logs it names outlive the scratch dir, in one file
            raise BuildFailed(keep_logs(str(exc), scratch)) from None
        raise
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    return BuildResult(plan, tuple(results))


def planned(arch: str, recipe: str | os.PathLike | None = None, overrides: PlanOverrides | None = None) -> BuildPlan:
    """The plan a build of ``arch`` runs: the recipe with the flags over it; for a serve command (``overrides.serve``,
    a recipe's ``serve``, or ``--model-config`` with kernelcache's vLLM flags as its shorthand), what the installed
    vLLM configures for it on the arch's GPU profiles (exercise/vllm_serve.py), with --gpu, --path, --vocab and
    --dtype still over it."""
    given = overrides or PlanOverrides()
    base = load(recipe)
    request = serve_request(base, given)
    if request is None:
        if base.command:
            raise RecipeError(f"{base.source}: its serve command needs the model's config")
        return base.override(given)
    if not given.serve:
        base.override(given)  # kernelcache's own checks of its flags first: a bad choice is named as before
    plan = base.override(PlanOverrides(gpus=given.gpus))
    if recipe is None:  # no recipe: every family the served model needs (plan/families/: each one's default)
        plan = replace(plan, paths=families.names())
    profiles = plan.for_arch(capability_to_arch(flag_capability(arch)))
    if not profiles:
        return plan  # plan_targets says the arch has no profile
    from .exercise.vllm_serve import resolve

    resolved = resolve(request.local, profiles, request.shown, imports=IMPORTABLE)
    remember_imports(resolved.imported)  # vLLM imported once: the preflight's import row is answered
    plan = plan.served(_agreed(resolved.configs), request.name)
    return plan.override(PlanOverrides(vocabs=given.vocabs, dtypes=given.dtypes, paths=given.paths))


def _agreed(configs: dict[str, ServeConfig]) -> ServeConfig:
    """The one configuration the profiles share; profiles vLLM configures differently build separately."""
    first_name, first = next(iter(configs.items()))
    for name, config in configs.items():
        differing = [k for k, v in config.keyed().items() if first.keyed()[k] != v]
        if differing:
            what = ", ".join(f"{k} {first.keyed()[k]} vs {config.keyed()[k]}" for k in differing)
            raise UsageError(f"vLLM configures {first_name} and {name} differently for this command ({what}): build "
                             f"them with separate --gpu, or set the flag in the serve command")
    return first


def _made_dirs(out: Path) -> list[Path]:
    """The directories ``out.mkdir(parents=True)`` is about to create, deepest first."""
    made = []
    for folder in (out.absolute(), *out.absolute().parents):
        if folder.exists():
            break
        made.append(folder)
    return made


def _remove_empty(made: list[Path]) -> None:
    """A failed build leaves no output dir it created and left empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (a bundle of another target was written), or gone


def keep_logs(message: str, scratch: Path) -> str:
    """``message`` with each file of ``scratch`` it names copied into one log file beside the scratch dir
    (``kernelcache-build-*.log``), and named instead: the scratch dir itself (the caches the exercise processes
    compiled into, tens of MB) goes."""
    named = sorted(set(re.findall(re.escape(str(scratch)) + r"[^\s()]*[^\s().,;:]", message)))
    named = [p for p in named if os.path.isfile(p)]
    if not named:
        return message
    log = scratch.with_name(f"{scratch.name}.log")
    try:
        with open(log, "w", encoding="utf-8") as handle:
            for path in named:
                handle.write(f"==> {path} <==\n{Path(path).read_text(encoding='utf-8', errors='replace')}\n")
    except OSError:
        return message
    for path in sorted(named, key=len, reverse=True):  # a longer name first: job.json.result before job.json
        message = message.replace(path, f"{log} ({os.path.relpath(path, scratch)})")
    return message


def _each_target(targets: list[BuildTarget], one: Callable[..., TargetResult], jobs: int,
                 records) -> list[TargetResult]:
    """Build each target. Targets that differ only by product (plan/targets.py) run at once on the shared ``jobs``
    exercise processes: a unit they share runs once and is copied by the others (buildcache/exercises.py) while
    their own units run beside it. Targets of other SM counts run one after the other, so that the later ones take
    the kernels they share from the build cache."""
    results = []
    for sm_count in sorted({t.sm_count for t in targets}):
        group = [t for t in targets if t.sm_count == sm_count]
        results += [one(group[0])] if len(group) == 1 else _at_once(group, one, jobs, records)
    return sorted(results, key=lambda r: targets.index(r.target))


def _at_once(targets: list[BuildTarget], one: Callable[..., TargetResult], jobs: int,
             records) -> list[TargetResult]:
    slots = threading.BoundedSemaphore(max(1, jobs))
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        futures = [pool.submit(one, target, slots) for target in targets]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
            return [f.result() for f in futures]
        except BaseException:
            if records is not None:
                records.stop()
            stop_exercises()
            raise


def _signed(result: TargetResult, signer: SigningKey | None) -> TargetResult:
    if signer is None:
        return result
    return replace(result, signatures=tuple(sign_bundle(b.path, signer) for b in result.bundles))


def _miss_tasks(logs: list[str], capability: int) -> tuple[Task, ...]:
    from .plan.misses import replay_tasks

    return tuple(task for log in logs for task in replay_tasks(log, capability))


def _load_target_env(path: str | os.PathLike | None):
    from .bundle import target_env

    return target_env.load(path) if path is not None else None


def check_target_env(plan: BuildPlan, targets: list[BuildTarget], there, source: str,
                     extra: bool = False) -> None:
    """Refuse (``FingerprintMismatch``) a build whose bundles the fingerprinted environment would refuse."""
    from .bundle import target_env

    triton = extra or any(p != "flashinfer" for p in plan.paths)
    for target in targets:
        for profile in target.profiles:
            planned = Target("cuda", target.arch, 32, gpu=profile.name, sm_count=target.sm_count)
            target_env.check(target_env.planned_manifest(planned, "flashinfer" in plan.paths), triton, there,
                             source)


# -- exercise -------------------------------------------------------------------------------------


# -- harvest and bundle ---------------------------------------------------------------------------


def _build_target(plan, target: BuildTarget, work: Path, out: Path, jobs: int, keep_ir: bool, extra_tasks,
                  progress, cache: BuildCacheSpec | None = None, records=None,
                  slots: threading.Semaphore | None = None, served: tuple[str, ...] = ()) -> TargetResult:
    started = time.perf_counter()
    run = exercise(plan, target, work, work / "cache", jobs, extra_tasks, progress,
                   variables=cache.worker_env() if cache else None, reuse=records, slots=slots)
    kept = records.keep(run.jobs, work / "cache") if records else None
    # A FlashInfer-only plan runs no exercise process: fingerprint this interpreter's Triton instead.
    environment = _environment(run.results) if run.results else local_environment([target.arch])
    identity = _identity(run.results) if run.results else identity_here([target.arch])
    walks = walks_of(run.results)
    records = run.log.compiles
    found = harvest(work / "cache", compiles=records, keep_ir=keep_ir)
    coverage = coverage_of(records)
    missing = sorted({r.key for r in records} - {e.key for e in found.kernels})
    if missing:
        raise BuildFailed(f"{len(missing)} compiled kernel(s) are missing from the cache, e.g. {missing[0]}")
    flashinfer, flashinfer_cache = _flashinfer_modules(plan, target, work, cache)
    attention, left_out = flashinfer_attention_modules(run.results, target)
    flashinfer += attention
    bundles, frames = [], _frames(cache)
    for profile in target.profiles:
        name = f"{plan.name}-{target.arch}-{profile.name}.tar.zst"
        engine, engine_left_out = _engine_compile(plan, target, profile, work, served)
        build_info = Build(tool=f"kernelcache {__version__}", mode=target.mode, source_date_epoch=source_date_epoch(),
                           keep_ir=keep_ir, plan=_plan_record(plan, target), coverage=coverage,
                           skipped=tuple(found.skipped) + left_out + engine_left_out)
        tgt = Target("cuda", target.arch, 32, gpu=profile.name, sm_count=target.sm_count,
                     device_keys=device_keys_of(run.log.device_tables, profile))
        bundles.append(make_bundle(out / name, found.entries, tgt, environment, build_info, flashinfer, identity,
                                   frames, walks, engine))
    ran = run.ran_log() if run.restored else run.log
    compiled = [r for r in ran.compiles if not r.cache_hit]
    return TargetResult(target, tuple(bundles), time.perf_counter() - started,
                        sum((r.compile_us or 0) for r in compiled) / 1e6, len(compiled), coverage,
                        tuple(found.skipped) + left_out,
                        build_cache=_with_frames(BuildCacheCounts.of(cache and cache.reported, ran.build_cache,
                                                                     flashinfer_cache, kept), frames))


def _served_locally(plan: BuildPlan, recipe, given: PlanOverrides) -> tuple[str, ...]:
    """The serve command's words with the model a local directory holding its config (the compile path runs vLLM's
    model code on it); () when the plan does not build the compile path."""
    if "compile" not in plan.paths:
        return ()
    request = serve_request(load(recipe), given)
    return request.local.args if request is not None else ()


def _engine_compile(plan: BuildPlan, target: BuildTarget, profile, work: Path,
                    served: tuple[str, ...]) -> tuple[tuple, tuple]:
    """vLLM's own compile for ``profile`` (enginecompile.py): its bundle members and what it left out."""
    if "compile" not in plan.paths:
        return (), ()
    if target.mode != "cross":
        raise BuildFailed("the compile path builds on the fake target (--mode cross); on a GPU, capture it")
    from .enginecompile import build_artifact

    record, members = build_artifact(list(served), plan.serve["command"], profile, work / f"compile-{profile.name}")
    return tuple(members), tuple(record["left_out"])


def _frames(cache: BuildCacheSpec | None):
    """Where this target's compressed bundles are kept (buildcache/frames.py); None without a build cache (one
    build's own store keeps none: its bundles differ by product, and it is gone after the build)."""
    if cache is None or cache.reported is None:
        return None
    from .buildcache import open_store
    from .buildcache.frames import StoreFrames

    return StoreFrames(open_store(cache))


def _with_frames(counts: BuildCacheCounts, frames) -> BuildCacheCounts:
    if frames is None:
        return counts
    return replace(counts, bundles=frames.reused, errors=tuple(sorted({*counts.errors, *frames.errors})))


def _unit_records(cache: BuildCacheSpec | None, targets: list[BuildTarget]):
    """Exercise records (buildcache/exercises.py) for cross targets: shared between the targets of this build, and
    with the build cache when there is one; None for a native build (it exercises the GPU that is there)."""
    if any(t.mode != "cross" for t in targets) or (cache is None and len(targets) == 1):
        return None
    from .buildcache import open_store
    from .buildcache.exercises import UnitRecords

    # One build's own store keeps no records: the targets of the build share units without it (UnitRecords.reuse).
    return UnitRecords(open_store(cache) if cache and cache.reported else None)


def device_keys_of(records: tuple[dict, ...], profile: GpuProfile) -> DeviceKeys | None:
    """What the device name decided in this build (None: nothing), for ``profile``'s bundle; ``BuildFailed``
    when the build ran under a device name whose configs are not the profile's (a bundle it would mislabel)."""
    if not records:
        return None
    devices = {r.get("device") for r in records}
    tables = sorted({DeviceTable(str(r.get("task")), r.get("loader"), r.get("looked_for"), r.get("file"),
                                 r.get("sha256"), r.get("configs_sha256")) for r in records},
                    key=lambda t: json.dumps(asdict(t), sort_keys=True))
    serves = dict(set.intersection(*(set((r.get("serves") or {}).items()) for r in records)))
    if len(devices) != 1 or profile.name not in serves:
        paths = ", ".join(sorted({t.path for t in tables}))
        raise BuildFailed(f"the {paths} kernels depend on the device name, and this build ran under "
                          f"{' and '.join(sorted(map(str, devices)))}, whose configs are not {profile.name}'s "
                          f"({profile.product})")
    return DeviceKeys(str(devices.pop()), tuple(tables), dict(sorted(serves.items())))


def _environment(results: tuple[WorkerResult, ...]) -> Environment:
    """The fingerprint the exercise processes themselves saw; they must all agree."""
    seen = {json.dumps(asdict(r.environment), sort_keys=True): r.environment for r in results if r.environment}
    if len(seen) != 1:
        raise BuildFailed(f"the exercise processes reported {len(seen)} different Triton environments")
    return next(iter(seen.values()))


def _identity(results: tuple[WorkerResult, ...]) -> TritonIdentity | None:
    """The exercise processes' Triton by content, when they all recorded the same (else none is kept)."""
    seen = {json.dumps(r.triton_identity, sort_keys=True) for r in results}
    only = json.loads(seen.pop()) if len(seen) == 1 else None
    return manifest_identity(only) if only else None


def walks_of(results: tuple[WorkerResult, ...]) -> dict | None:
    """One record of the exercise processes' walks of their ``@jit`` functions (exercise/worker.py ``_walks``), for
    the bundle: each function as the first process (in plan order) that walked it recorded it, so the same units
    give the same record. None when no process kept one, or they ran different Tritons."""
    records = [r.walks for r in results if isinstance(r.walks, dict) and isinstance(r.walks.get("functions"), dict)]
    if not records or len({(r.get("format"), r.get("triton_key")) for r in records}) != 1:
        return None
    functions: dict = {}
    for record in records:
        for name, entry in record["functions"].items():
            functions.setdefault(name, entry)
    return {**records[0], "functions": dict(sorted(functions.items()))}


def _flashinfer_modules(plan: BuildPlan, target: BuildTarget, work: Path,
                        cache: BuildCacheSpec | None = None) -> tuple[tuple, str | None]:
    """FlashInfer's ``sampling`` module: built for the arch (cross; taken from the build cache when it has it), or
    what vLLM's path JIT-built (native); and what the build cache did (buildcache/flashinfer_modules.py)."""
    if not any(p in families.flashinfer("built") for p in plan.paths):
        return (), None
    if target.mode == "native":
        return flashinfer_jit_module(plan, target, work), None
    from .buildcache.flashinfer_modules import module_key, take_or_build
    from .exercise import flashinfer_sampling as fi_build

    key = module_key(fi_build.arch_list(target.arch), fi_build.ensure_toolchain().cuda)
    built, outcome = take_or_build(cache, key, lambda: fi_build.build_sampling(
        target.arch, work / "flashinfer", jobs=min(2, os.cpu_count() or 1)))
    return (built,), outcome


def flashinfer_attention_modules(results: tuple[WorkerResult, ...], target: BuildTarget) -> tuple[tuple, tuple]:
    """The FlashInfer modules the tasks of the families that JIT them built (``Family.flashinfer`` "tasks":
    flashinfer_attention's, exercise/vllm_flashinfer.py), as (module,
    members) pairs, each URI once; and what they left out, as skipped records (``path``: ``flashinfer/<name>``,
    ``reason``)."""
    from .exercise import flashinfer_sampling as fi_build

    modules: dict[str, tuple] = {}
    left_out: dict[str, str] = {}
    cuda = None  # the toolchain's CUDA version, asked only for a module to take: a plan without one fetches none
    for task in (t for r in results for t in r.tasks if t.label in families.flashinfer("tasks") and t.ok):
        summary = task.summary if isinstance(task.summary, dict) else {}
        for name, built in (summary.get("built") or {}).items():
            if cuda is None:
                cuda = fi_build.ensure_toolchain().cuda if target.mode == "cross" else ""
            if name not in modules:
                modules[name] = fi_build.take_module(Path(built["library"]), target.arch, cuda,
                                                     tuple(built.get("sources") or ()), built.get("sources_sha256"))
        left_out.update(summary.get("left_out") or {})
    skipped = tuple({"path": f"flashinfer/{name}", "reason": why} for name, why in sorted(left_out.items()))
    return tuple(modules[name] for name in sorted(modules)), skipped


def _plan_record(plan: BuildPlan, target: BuildTarget) -> dict:
    """The plan as this target ran it (its own profiles): ``verify`` replays it from the manifest."""
    return {**plan.to_dict(), "gpus": [asdict(p) for p in target.profiles]}


def coverage_of(records: tuple[CompileRecord, ...]) -> dict:
    """Per kernel: how many distinct keys, and how many each path produced (the manifest's ``coverage``)."""
    keys: dict[str, set] = defaultdict(set)
    by_path: dict[str, Counter] = defaultdict(Counter)
    seen_pairs = set()
    for r in records:
        keys[r.name].add(r.key)
        pair = (r.name, r.key, r.task)
        if pair not in seen_pairs:
            seen_pairs.add(pair)
            by_path[r.name][r.task or "?"] += 1
    return {name: {"variants": len(keys[name]), "by_path": dict(sorted(by_path[name].items()))}
            for name in sorted(keys)}
