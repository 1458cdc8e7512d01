"""``kernelcache tune``: time a bundle's autotuned kernels on a GPU of its profile and carry the choices in a bundle.

A Triton ``@autotune`` kernel times every candidate config at the first launch of each tuning key in every new
process, even when each candidate's cubin is a disk hit (Nemotron-H's Mamba-2 SSD kernels: seconds). Triton
keeps what it timed when its autotune cache is on (``Autotuner.check_disk_cache``, triton/runtime/autotuner.py):
``<key dir>/<kernel>.autotune.json`` under a key that hashes Triton, the backend, the kernel's source key, the set
cache-invalidating variables, the tuning key and the candidates, but not the GPU product. ``tune``:

1. picks a visible GPU of the bundle's target (arch, SM count, the product of its GPU profile and of its device
   keys), refusing with exit 21 when there is none;
2. installs the bundle into a fresh cache dir, leaving any choices it already carries out;
3. replays the bundle's recorded plan there natively, one exercise process at a time on that GPU alone, with
   ``TRITON_CACHE_AUTOTUNING=1``: Triton itself times the candidates and writes its files; every kernel must be a
   disk hit (0 compiles: the cubins are the bundle's, else ``CompilesDetected``);
4. reads back every autotune file the run wrote (each must be one Triton can read), stamps them with the GPU's
   product, driver and clocks, and writes a new bundle: the same members and manifest plus ``tuning``
   (docs/FORMAT.md). ``merge`` folds such a bundle into another of the same kernels.

What runs is whatever the plan's exercise tasks launch; a plan that launches no autotuned kernel (a sampler
bundle) has nothing to tune (``NothingTuned``). A tune that fails keeps its scratch dir (``kernelcache-tune-*``
under the temp dir: the exercise processes' logs); one that succeeds or is interrupted removes it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import ArchMismatch, CompilesDetected, KernelcacheError, NothingTuned, UsageError
from .exercise.jobs import exercise
from .format.archive import bundle_digest, extract, read_manifest, write
from .format.manifest import AUTOTUNE_SUFFIX, FileRecord, Manifest, Tuning
from .hooks.kernelcache_autotune import unusable
from .install import check_choices, plan_install
from .plan.gpus import PROFILES, GpuProfile, VisibleGpu, stamp, visible_gpus
from .plan.targets import BuildTarget
from .verify import recorded_plan


@dataclass(frozen=True)
class Choice:
    """One autotune file the run wrote: the kernel, its tuning key, the config with the least time."""

    kernel: str
    path: str  # <key dir>/<kernel>.autotune.json
    key: str  # the tuning key as Triton wrote it (the key arguments' values and the tensor dtypes)
    config: str  # the chosen config, as Triton prints it
    candidates: int  # configs timed for it


@dataclass(frozen=True)
class TuneResult:
    path: Path  # the tuned bundle
    digest: str
    source: str  # the digest of the bundle that was tuned
    tuning: Tuning
    choices: tuple[Choice, ...]
    benchmarks: int  # candidate configs Triton timed
    hits: int  # kernels the run took from the bundle (compile() disk hits)
    seconds: float

    def to_dict(self) -> dict:
        return {"path": str(self.path), "digest": self.digest, "source": self.source,
                "tuned_on": {"product": self.tuning.product, "driver": self.tuning.driver, "cuda": self.tuning.cuda,
                             "clocks": dict(self.tuning.clocks)},
                "choices": [vars(c) for c in self.choices], "benchmarks": self.benchmarks, "compiles": 0,
                "hits": self.hits, "seconds": self.seconds}


def tune(bundle: str | os.PathLike, output: str | os.PathLike | None = None,
         cache_dir: str | os.PathLike | None = None) -> TuneResult:
    """Time ``bundle``'s autotuned kernels here and write the bundle with the choices to ``output`` (default:
    ``<name>-tuned.tar.zst`` beside it). ``cache_dir``: install and time there, and keep it (it must be empty or
    absent: choices already in it would be taken without timing); default a temporary dir."""
    started = time.perf_counter()
    source = Path(bundle)
    manifest = read_manifest(source)
    out = _output(source, output)
    kept = _fresh(Path(cache_dir)) if cache_dir is not None else None
    gpu = tuning_gpu(manifest)
    scratch, failed = Path(tempfile.mkdtemp(prefix="kernelcache-tune-")), False
    try:
        root = kept or scratch / "cache"
        plan = replace(plan_install(source, root), choices_skipped="kernelcache tune times them again")
        plan.execute()
        when = stamp(gpu)
        run = _replay(manifest, gpu, root, scratch / "work")
        choices, data = harvest_choices(root)
        if not choices:
            raise NothingTuned(f"the plan of {source.name} launched no autotuned kernel whose choice Triton keeps "
                               "(none of its paths has one, or its configs have pre-hooks): nothing to tune")
        tuning = Tuning(when.product, when.driver, when.cuda, when.clocks,
                        tuple(FileRecord(path, len(blob), _sha256(blob)) for path, blob in sorted(data.items())))
        tuned = with_choices(source, manifest, tuning, data, out)
    except KernelcacheError:
        failed = True  # its exercise logs say why (an error from an exercise process names its log)
        raise
    finally:
        if not failed:
            shutil.rmtree(scratch, ignore_errors=True)
    benchmarks = sum(1 for r in run.log.autotune if r.get("event") == "autotune_bench")
    return TuneResult(out, bundle_digest(tuned), bundle_digest(manifest), tuning, choices, benchmarks,
                      sum(1 for r in run.log.compiles if r.cache_hit), time.perf_counter() - started)


def _output(source: Path, output: str | os.PathLike | None) -> Path:
    out = Path(output) if output is not None else source.with_name(
        source.name.removesuffix(".zst").removesuffix(".tar") + "-tuned.tar.zst")
    if out.resolve() == source.resolve():
        raise UsageError(f"{out} is the bundle being tuned; write the tuned bundle to another file (-o)")
    if not out.parent.is_dir():
        raise UsageError(f"cannot write {out}: {out.parent} is not a directory")
    return out


def _fresh(root: Path) -> Path:
    """``--cache-dir``: absent or empty, since Triton would take an autotune file already there without timing."""
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UsageError(f"--cache-dir {root} must be absent or empty: choices already there would be taken without "
                         "timing")
    return root


def tuning_gpu(manifest: Manifest) -> VisibleGpu:
    """The first visible GPU of the bundle's target: its arch, its SM count, the product of its GPU profile and one
    its device-keyed kernels serve. ``ArchMismatch`` (exit 21) when there is none."""
    target, keys = manifest.target, manifest.device_keys
    profile = PROFILES.get(target.gpu or "")
    visible = visible_gpus()
    for gpu in visible:
        if gpu.capability == target.capability and (not target.sm_count or gpu.sm_count == target.sm_count) \
                and (profile is None or profile.product in gpu.name) and (keys is None or keys.accepts(gpu.name)):
            return gpu
    wanted = " ".join(filter(None, (target.arch, f"{target.sm_count} SMs" if target.sm_count else None,
                                    profile.product if profile else None)))
    rows = [(f"gpu[{g.index}]", wanted, f"{g.name} ({g.arch}, {g.sm_count} SMs)") for g in visible]
    raise ArchMismatch(f"kernelcache tune times on a GPU of the bundle's profile ({wanted}); "
                       f"{'none of the visible GPUs is one' if visible else 'no GPU is visible'}",
                       rows or [("gpu", wanted, "(none visible)")])


def _replay(manifest: Manifest, gpu: VisibleGpu, root: Path, work: Path):
    """The bundle's plan, natively on ``gpu`` alone, one process at a time, Triton's autotune cache on."""
    plan = recorded_plan(manifest)
    name = manifest.target.gpu or "bundle"
    profile = GpuProfile(name, gpu.arch, gpu.sm_count, gpu.name)
    target = BuildTarget(gpu.arch, gpu.sm_count, (profile,), "native")
    variables = {"TRITON_CACHE_AUTOTUNING": "1", "CUDA_VISIBLE_DEVICES": _only(gpu)}
    run = exercise(plan, target, work, root, 1, served=True, tune=True, variables=variables)
    missed = sorted({r.name for r in run.log.compiles if not r.cache_hit})
    if missed:
        raise CompilesDetected(f"tune compiled {len(missed)} kernel(s) the bundle lacks here ({', '.join(missed[:3])}"
                               f"{' …' if len(missed) > 3 else ''}): its plan does not replay as built on this GPU; "
                               "no choices written")
    return run


def _only(gpu: VisibleGpu) -> str:
    """``CUDA_VISIBLE_DEVICES`` that shows the exercise processes ``gpu`` alone (its index counts the GPUs this
    process sees)."""
    shown = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return shown[gpu.index] if gpu.index < len(shown) else str(gpu.index)


def harvest_choices(root: Path) -> tuple[tuple[Choice, ...], dict[str, bytes]]:
    """Every autotune file under the cache dir ``root`` (``<key dir>/<kernel>.autotune.json``), each one Triton can
    read (``UsageError`` naming the first that is not), as choices and as bundle members."""
    from triton.runtime.autotuner import Config

    choices, data = [], {}
    for path in sorted(root.glob(f"*/*{AUTOTUNE_SUFFIX}")):
        rel = f"{path.parent.name}/{path.name}"
        problem = unusable(str(path), Config)
        if problem is not None:
            raise UsageError(f"{rel}: {problem}")
        blob = path.read_bytes()
        record = json.loads(blob)
        timings = {str(Config(**settings)): _median(timing) for settings, timing in record["configs_timings"]}
        best = min(timings, key=timings.get)
        choices.append(Choice(path.name.removesuffix(AUTOTUNE_SUFFIX), rel, str(record.get("key")), best, len(timings)))
        data[rel] = blob
    return tuple(choices), data


def _median(timing) -> float:
    """Triton's timing of one config: the benchmarker's quantiles (median first), or one number."""
    return float(timing[0] if isinstance(timing, list) else timing)


def with_choices(source: Path, manifest: Manifest, tuning: Tuning, data: dict[str, bytes], output: Path) -> Manifest:
    """Write ``source``'s members (verified), less any choices it carried, and ``data`` under ``tuning`` to
    ``output``; the new manifest."""
    tuned = replace(manifest, tuning=tuning)
    check_choices(tuned)
    old = {f.path for f in manifest.tuning.files} if manifest.tuning else set()
    with tempfile.TemporaryDirectory(prefix=".kernelcache-tune-", dir=output.parent) as work:
        extract(source, work)
        members = [(f.path, lambda p=Path(work) / f.path: p.read_bytes())
                   for f in manifest.files() if f.path not in old]
        members += [(path, lambda blob=blob: blob) for path, blob in data.items()]
        write(output, tuned, members)
    return tuned


def _sha256(blob: bytes) -> str:
    import hashlib

    return hashlib.sha256(blob).hexdigest()
