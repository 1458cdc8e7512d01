"""``kernelcache build``: plan -> exercise -> harvest -> bundle, for one GPU arch.

1. The build manifest (plan/manifest.py) and the flags give a ``BuildPlan``.
2. The plan's GPU profiles of the arch are grouped by SM count (profiles with the same arch and SM
   count compile identical keys) into ``BuildTarget``s.
3. For each target, one exercise process per vocab size runs the requested vLLM paths
   (exercise/vllm_sampler.py) into one fresh ``TRITON_CACHE_DIR`` -- natively when a GPU of that arch
   is visible, otherwise behind the fake target -- ``--jobs`` at a time.
4. The cache is harvested and written as one bundle per GPU profile, with the plan, the coverage
   (which specializations of which kernel each path produced) and the environment fingerprint.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import __version__
from .bundle.archive import source_date_epoch
from .bundle.fingerprint import local_environment, package_version
from .bundle.make import PackResult, make_bundle
from .bundle.manifest import Build, Environment, Target, capability_to_arch, flag_capability
from .errors import BuildFailed, PathUnavailable, UsageError
from .exercise import listener
from .exercise.worker import Job, Task
from .harvest import harvest
from .plan import manifest as plan_file
from .plan.gpus import PROFILES, GpuProfile, VisibleGpu, profile_for, visible_gpus

SAMPLER = "kernelcache.exercise.vllm_sampler"
REQUIRED_MODULES = {
    "registry": ("vllm.model_executor.warmup.jit_warmup", "vLLM's JIT warmup registry"),
    "mrv1": ("vllm.v1.sample.sampler", "the V1 (MRV1) Sampler"),
    "mrv2": ("vllm.v1.worker.gpu.sample.gumbel", "Model Runner V2's Gumbel sampler"),
    "flashinfer": ("flashinfer", "flashinfer-python"),
}


@dataclass(frozen=True)
class BuildTarget:
    arch: str
    sm_count: int
    profiles: tuple[GpuProfile, ...]
    mode: str  # "cross" | "native"

    @property
    def capability(self) -> int:
        return int(self.arch.removeprefix("sm_"))

    @property
    def label(self) -> str:
        return f"{self.arch}-{self.sm_count}sm"


@dataclass(frozen=True)
class TargetResult:
    target: BuildTarget
    bundles: tuple[PackResult, ...]
    seconds: float
    compile_seconds: float
    compiles: int
    coverage: dict
    skipped: tuple[dict, ...] = ()


@dataclass(frozen=True)
class BuildResult:
    plan: plan_file.BuildPlan
    targets: tuple[TargetResult, ...] = field(default_factory=tuple)

    @property
    def bundles(self) -> list[PackResult]:
        return [b for t in self.targets for b in t.bundles]


def build(arch: str, manifest: str | os.PathLike | None = None, gpus: list[str] | None = None,
          vocabs: list[int] | None = None, dtypes: list[str] | None = None, max_num_seqs: int | None = None,
          paths: list[str] | None = None, mode: str = "auto", jobs: int | None = None,
          output_dir: str | os.PathLike = "bundles", keep_ir: bool = False, workdir: str | os.PathLike | None = None,
          extra_tasks: tuple[Task, ...] = (), progress: Callable[[str, int, int], None] | None = None,
          from_misses: list[str] | None = None, target_env: str | os.PathLike | None = None) -> BuildResult:
    """Build one bundle per GPU profile of ``arch`` from a build manifest (flags override it).

    ``from_misses``: overlay miss logs (``kernelcache run --read-only``) whose misses for this arch are
    compiled again, so the next bundle covers them. ``target_env``: a fingerprint file of the serving
    environment (``kernelcache fingerprint --json``); the build stops before compiling anything if
    ``install`` would refuse its bundles there. A cross build of FlashInfer's module fetches its CUDA
    toolchain first when none is here (exercise/flashinfer.py: ``ensure_toolchain``).
    """
    arch = capability_to_arch(flag_capability(arch))
    there = _load_target_env(target_env)
    plan = plan_file.load(manifest).override(gpus=gpus, vocabs=vocabs, dtypes=dtypes, max_num_seqs=max_num_seqs,
                                             paths=paths)
    check_paths(plan)
    targets = plan_targets(plan, arch, mode, visible_gpus() if mode != "cross" else [])
    if there is not None:
        check_target_env(plan, targets, there, str(target_env), bool(extra_tasks or from_misses))
    if "flashinfer" in plan.paths and any(t.mode == "cross" for t in targets):
        from .exercise.flashinfer import ensure_toolchain

        ensure_toolchain()  # before the Triton compiles: a missing toolchain fails in seconds, not minutes
    jobs = jobs or os.cpu_count() or 1
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    scratch = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="kernelcache-build-"))
    keep = workdir is not None
    try:
        for target in targets:
            work = scratch / target.label
            if work.exists():
                shutil.rmtree(work)
            tasks = tuple(extra_tasks) + _miss_tasks(from_misses or [], target.capability)
            results.append(_build_target(plan, target, work, out, jobs, keep_ir, tasks, progress))
    except BuildFailed:
        keep = True  # its message points at logs in the scratch dir: leave them to be read
        raise
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
    return BuildResult(plan, tuple(results))


def _miss_tasks(logs: list[str], capability: int) -> tuple[Task, ...]:
    from .plan.misses import replay_tasks

    return tuple(task for log in logs for task in replay_tasks(log, capability))


def check_paths(plan: plan_file.BuildPlan) -> None:
    """Say clearly when the installed vLLM (or FlashInfer) lacks a path the plan asks for."""
    if importlib.util.find_spec("vllm") is None:
        raise PathUnavailable("vLLM is not installed here; `kernelcache build` runs vLLM's own sampler code")
    for path in plan.paths:
        module, what = REQUIRED_MODULES[path]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            where = "installed" if path == "flashinfer" else f"in the installed vllm {package_version('vllm')}"
            raise PathUnavailable(
                f"the manifest asks for the '{path}' path but {what} ({module}) is not {where}; "
                "drop it from vllm.paths or pass --path"
            )


def _load_target_env(path: str | os.PathLike | None):
    from .bundle import target_env

    return target_env.load(path) if path is not None else None


def check_target_env(plan: plan_file.BuildPlan, targets: list[BuildTarget], there, source: str,
                     extra: bool = False) -> None:
    """Refuse (``FingerprintMismatch``) a build whose bundles the fingerprinted environment would refuse."""
    from .bundle import target_env

    triton = extra or any(p in plan.paths for p in ("registry", "mrv1", "mrv2"))
    for target in targets:
        for profile in target.profiles:
            planned = Target("cuda", target.arch, 32, gpu=profile.name, sm_count=target.sm_count)
            target_env.check(target_env.planned_manifest(planned, "flashinfer" in plan.paths), triton, there,
                             source)


def plan_targets(plan: plan_file.BuildPlan, arch: str, mode: str, gpus: list[VisibleGpu]) -> list[BuildTarget]:
    """The distinct (arch, SM count) builds, native when a GPU of the arch is visible (mode auto)."""
    if mode not in ("auto", "cross", "native"):
        raise UsageError(f"--mode must be auto, cross or native, got {mode!r}")
    profiles = plan.for_arch(arch)
    local = [g for g in gpus if g.arch == arch]
    native = mode == "native" or (mode == "auto" and bool(local))
    if native:
        if not local:
            raise UsageError(f"--mode native needs a visible {arch} GPU; none is visible (use --mode cross)")
        gpu = local[0]
        matching = tuple(p for p in profiles if p.sm_count == gpu.sm_count)
        if profiles and not matching:
            names = ", ".join(p.name for p in profiles)
            raise UsageError(f"the visible {gpu.name} has {gpu.sm_count} SMs, which matches none of the requested "
                             f"profiles ({names}); use --mode cross to build for them")
        chosen = matching or (profile_for(gpu) or GpuProfile(f"local-{gpu.capability}", arch, gpu.sm_count, gpu.name),)
        return [BuildTarget(arch, gpu.sm_count, chosen, "native")]
    if not profiles:
        known = ", ".join(sorted({p.arch for p in plan.gpus}))
        fits = ", ".join(sorted(p.name for p in PROFILES.values() if p.arch == arch)) or "none is built in"
        raise UsageError(f"the plan's GPU profiles are for {known}, not {arch}; pass --gpu with a profile of {arch} "
                         f"({fits}) or define one in the manifest")
    by_sm: dict[int, list[GpuProfile]] = defaultdict(list)
    for p in profiles:
        by_sm[p.sm_count].append(p)
    return [BuildTarget(arch, sm, tuple(ps), "cross") for sm, ps in sorted(by_sm.items())]


# -- exercise -------------------------------------------------------------------------------------


def vocab_tasks(plan: plan_file.BuildPlan, target: BuildTarget, vocab: int) -> tuple[Task, ...]:
    """The exercise tasks of one vocab size: the requested paths, registry first (the others then hit).

    The runtime paths run one batch size per specialization class of ``1..max_num_seqs*(spec+1)``,
    which the worker derives from vLLM's own split-count rule and the target's SM count.
    """
    max_batch = plan.max_num_seqs * (plan.num_speculative_tokens + 1)
    processed = "float32" in plan.dtypes
    # Every logits dtype is also a model dtype: an fp32 model's raw logits reach MRV2's Gumbel kernel with
    # APPLY_TEMPERATURE=True, a key of its own (seen missing on the H200 when only bf16/fp16 were raw).
    model_dtypes = list(plan.dtypes)
    tasks = []
    if "registry" in plan.paths and processed:
        tasks.append(Task(f"{SAMPLER}:registry", {"vocab": vocab, "max_num_seqs": plan.max_num_seqs,
                                                   "num_speculative_tokens": plan.num_speculative_tokens},
                          label="registry"))
    if "mrv1" in plan.paths and processed:
        tasks.append(Task(f"{SAMPLER}:mrv1", {"vocab": vocab, "max_batch": max_batch, "modes": list(plan.modes),
                                               "seeded": plan.seeded, "unseeded": plan.unseeded and
                                               "flashinfer" not in plan.paths, "dtypes": list(plan.dtypes)},
                          label="mrv1"))
    if "mrv2" in plan.paths:
        tasks.append(Task(f"{SAMPLER}:mrv2", {
            "vocab": vocab, "max_batch": max_batch, "modes": list(plan.modes) if processed else [],
            "model_dtypes": model_dtypes, "max_num_reqs": plan.max_num_seqs, "min_p": plan.min_p,
            "fp64_gumbel": plan.fp64_gumbel}, label="mrv2"))
    return tuple(tasks)


def _jobs(plan: plan_file.BuildPlan, target: BuildTarget, work: Path, cache: Path, jobs: int,
          extra_tasks: tuple[Task, ...]) -> list[tuple[str, Path, Job]]:
    threads = str(max(1, (os.cpu_count() or 1) // max(1, min(jobs, len(plan.vocabs)))))
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_TRITON_JIT_WARMUP_NUM_THREADS": threads,
           "TQDM_DISABLE": "1", **reproducible_cc(work)}
    setup = ()
    if target.mode == "cross":
        product = target.profiles[0].product
        setup = (Task(f"{SAMPLER}:setup_platform", {"capability": target.capability, "sm_count": target.sm_count,
                                                     "product": product}, label="platform"),)
    units = [(str(v.size), vocab_tasks(plan, target, v.size)) for v in plan.vocabs]
    if extra_tasks:
        units.append(("extra", tuple(extra_tasks)))
    out = []
    for name, tasks in units:
        if not tasks:
            continue
        job_dir = work / "jobs" / name
        job_dir.mkdir(parents=True, exist_ok=True)
        out.append((name, job_dir, Job(cache_dir=str(cache), compile_log=str(job_dir / "compiles.jsonl"),
                                       capability=target.capability, sm_count=target.sm_count, mode=target.mode,
                                       tasks=tasks, env=env, setup=setup)))
    return out


_CC_WRAPPER = """#!/bin/sh
# kernelcache: Triton builds its launchers and cuda_utils from a random temp dir ($1 is the source),
# and cuda_utils.c's __FILE__ would put that dir in the .so; map it to "." so builds are reproducible.
exec "$KERNELCACHE_REAL_CC" "$@" "-ffile-prefix-map=${1%/*}=."
"""


def reproducible_cc(work: Path) -> dict[str, str]:
    """``CC`` for the exercise processes: the user's compiler (``CC``, else gcc, else clang) behind a
    wrapper that maps Triton's temp source dir away, so the same inputs give byte-identical modules."""
    real = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
    if not real:
        return {}  # Triton's own "Failed to find C compiler" then says what to do
    work.mkdir(parents=True, exist_ok=True)
    wrapper = work / "cc"
    wrapper.write_text(_CC_WRAPPER)
    wrapper.chmod(0o755)
    return {"CC": str(wrapper), "KERNELCACHE_REAL_CC": real}


def _run_job(job_dir: Path, job: Job) -> dict:
    path = job_dir / "job.json"
    path.write_text(job.to_json())
    with open(job_dir / "worker.log", "w", encoding="utf-8") as log:
        child = subprocess.Popen([sys.executable, "-m", "kernelcache.exercise.worker", str(path)],
                                 stdout=log, stderr=subprocess.STDOUT, env=_worker_env())
        _children.add(child)
        try:
            returncode = child.wait()
        finally:
            _children.discard(child)
    if returncode in (-signal.SIGINT, -signal.SIGTERM, 130):
        raise KeyboardInterrupt
    result_file = job_dir / "job.json.result"
    if not result_file.exists():
        raise BuildFailed(f"exercise process for {job_dir.name} died (exit {returncode}); "
                          f"see {job_dir / 'worker.log'}")
    result = json.loads(result_file.read_text())
    failed = [t for t in result["tasks"] if not t["ok"]]
    if failed:
        first = failed[0]
        if "SIGINT" in str(first["error"]):  # Ctrl-C reached the worker's compiler first
            raise KeyboardInterrupt
        raise BuildFailed(f"{job_dir.name}: task {first['label']} failed: {first['error']} "
                          f"(traceback in {result_file})")
    return result


_children: set[subprocess.Popen] = set()  # running exercise processes, stopped when the build is interrupted


def _stop_children() -> None:
    for child in list(_children):
        child.terminate()


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_CACHE_DIR", None)
    env.pop("TRITON_CACHE_MANAGER", None)
    return env


def exercise(plan: plan_file.BuildPlan, target: BuildTarget, work: Path, cache: Path, jobs: int,
             extra_tasks: tuple[Task, ...] = (), progress=None) -> tuple[list[dict], list[dict]]:
    """Run the plan's paths for one target into ``cache``; returns worker results and the compile log."""
    results = _run_jobs(_jobs(plan, target, work, cache, jobs, extra_tasks), target, jobs, progress)
    log = work / "compiles.jsonl"
    cache.mkdir(parents=True, exist_ok=True)  # also when the plan has no Triton path (FlashInfer only)
    records = []
    with open(log, "w", encoding="utf-8") as handle:
        for job_log in sorted(work.glob("jobs/*/compiles.jsonl")):
            for record in listener.read(str(job_log)):
                records.append(record)
                handle.write(json.dumps(record) + "\n")
    return results, records


def _run_jobs(units, target: BuildTarget, jobs: int, progress) -> list[dict]:
    done = 0
    if progress:
        progress(target.label, done, len(units))
    results = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_run_job, job_dir, job) for _, job_dir, job in units]
        try:
            for future in futures:
                results.append(future.result())
                done += 1
                if progress:
                    progress(target.label, done, len(units))
        except BaseException:
            for f in futures:
                f.cancel()
            _stop_children()
            raise
    return results


# -- harvest and bundle ---------------------------------------------------------------------------


def _build_target(plan, target: BuildTarget, work: Path, out: Path, jobs: int, keep_ir: bool, extra_tasks,
                  progress) -> TargetResult:
    started = time.perf_counter()
    results, log_records = exercise(plan, target, work, work / "cache", jobs, extra_tasks, progress)
    # A FlashInfer-only plan runs no exercise process: fingerprint this interpreter's Triton instead.
    environment = _environment(results) if results else local_environment([target.arch])
    records = listener.compiles(log_records)
    found = harvest(work / "cache", compile_log=str(work / "compiles.jsonl"), keep_ir=keep_ir)
    coverage = coverage_of(records)
    missing = sorted({r["key"] for r in records} - {e.key for e in found.kernels})
    if missing:
        raise BuildFailed(f"{len(missing)} compiled kernel(s) are missing from the cache, e.g. {missing[0]}")
    flashinfer = _flashinfer_modules(plan, target, work)
    bundles = []
    for profile in target.profiles:
        name = f"{plan.name}-{target.arch}-{profile.name}.tar.zst"
        build_info = Build(tool=f"kernelcache {__version__}", mode=target.mode, source_date_epoch=source_date_epoch(),
                           keep_ir=keep_ir, plan=_plan_record(plan, target), coverage=coverage,
                           skipped=tuple(found.skipped))
        tgt = Target("cuda", target.arch, 32, gpu=profile.name, sm_count=target.sm_count)
        bundles.append(make_bundle(out / name, found.entries, tgt, environment, build_info, flashinfer))
    compiled = [r for r in records if not r["cache_hit"]]
    return TargetResult(target, tuple(bundles), time.perf_counter() - started,
                        sum((r.get("compile_us") or 0) for r in compiled) / 1e6, len(compiled), coverage,
                        tuple(found.skipped))


def _environment(results: list[dict]) -> Environment:
    """The fingerprint the exercise processes themselves saw; they must all agree."""
    seen = {json.dumps(r["environment"], sort_keys=True) for r in results if r.get("environment")}
    if len(seen) != 1:
        raise BuildFailed(f"the exercise processes reported {len(seen)} different Triton environments")
    return Environment(**json.loads(seen.pop()))


def _plan_record(plan: plan_file.BuildPlan, target: BuildTarget) -> dict:
    """The plan as this target ran it (its own profiles): ``verify`` replays it from the manifest."""
    return {**plan.to_dict(), "gpus": [asdict(p) for p in target.profiles]}


def coverage_of(records: list[dict]) -> dict:
    """Per kernel: how many distinct keys, and how many each path produced."""
    keys: dict[str, set] = defaultdict(set)
    by_path: dict[str, Counter] = defaultdict(Counter)
    seen_pairs = set()
    for r in records:
        keys[r["name"]].add(r["key"])
        pair = (r["name"], r["key"], r.get("task"))
        if pair not in seen_pairs:
            seen_pairs.add(pair)
            by_path[r["name"]][r.get("task") or "?"] += 1
    return {name: {"variants": len(keys[name]), "by_path": dict(sorted(by_path[name].items()))}
            for name in sorted(keys)}


def _flashinfer_modules(plan, target: BuildTarget, work: Path) -> tuple:
    """FlashInfer's ``sampling`` module: built for the arch (cross), or what vLLM's path JIT-built (native)."""
    if "flashinfer" not in plan.paths:
        return ()
    from .exercise import flashinfer as fi_build

    if target.mode == "cross":
        return (fi_build.build_sampling(target.arch, work / "flashinfer", jobs=min(2, os.cpu_count() or 1)),)
    base = work / "flashinfer-jit"
    job_dir = work / "jobs" / "flashinfer"
    job_dir.mkdir(parents=True, exist_ok=True)
    vocab = plan.vocabs[0].size
    job = Job(cache_dir=str(work / "cache"), compile_log=str(job_dir / "compiles.jsonl"), capability=target.capability,
              sm_count=target.sm_count, mode="native", prebuild=False,
              tasks=(Task(f"{SAMPLER}:flashinfer", {"vocab": vocab}, label="flashinfer"),),
              env={"FLASHINFER_WORKSPACE_BASE": str(base), "VLLM_USE_FLASHINFER_SAMPLER": "1"})
    _run_job(job_dir, job)
    jit_dirs = sorted(base.glob(".cache/flashinfer/*/*/cached_ops"))
    if not jit_dirs:
        raise BuildFailed(f"vLLM's FlashInfer path built no JIT module under {base}")
    return (fi_build.harvest_sampling(jit_dirs[0], target.arch),)
