"""A plan's build targets for one arch, and whether this interpreter can run the plan's paths.

Profiles with the same arch and SM count compile identical sampler keys, so they share one ``BuildTarget``:
one exercise run, one bundle per profile. The moe and mamba paths also depend on the product name (vLLM picks
its tuned fused-MoE tile configs and ``selective_state_update``'s configs by device name), so with either each
product is its own target (and a native build makes bundles only for the visible GPU's product).
A target is ``native`` when a GPU of the arch is visible
(mode auto) and ``cross`` (behind the fake target) otherwise.
"""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..errors import MissingDependency, PathUnavailable, ReleaseUnsupported, UsageError
from ..format.fingerprint import package_version
from ..format.manifest import arch_to_capability
from . import families, releases
from .gpus import PROFILES, GpuProfile, VisibleGpu, profile_for
from .recipe import BuildPlan


def required_module(path: str) -> tuple[str, str]:
    """(the module a path needs installed, what to call it): the family's own declaration."""
    return families.get(path).about.requires


def device_keyed(plan: BuildPlan) -> bool:
    """Whether the plan has a path vLLM configures by device name (a path that reads such a table but does not
    declare ``keys_follow_device`` fails its build, build.py ``device_keys_of``, rather than mislabel a bundle)."""
    return any(p in families.device_keyed() for p in plan.paths)


@dataclass(frozen=True)
class BuildTarget:
    arch: str
    sm_count: int
    profiles: tuple[GpuProfile, ...]
    mode: str  # "cross" | "native"
    product: str = ""  # set when the keys depend on the product name (families.device_keyed())

    @property
    def capability(self) -> int:
        return arch_to_capability(self.arch)

    @property
    def label(self) -> str:
        base = f"{self.arch}-{self.sm_count}sm"
        return f"{base}-{self.profiles[0].name}" if self.product else base


def check_paths(plan: BuildPlan) -> None:
    """Say clearly when the installed vLLM (or FlashInfer) lacks a path the plan asks for."""
    if importlib.util.find_spec("vllm") is None:
        raise MissingDependency("vLLM is not installed here; `kernelcache build` runs vLLM's own code")
    check_release(plan.paths, releases.installed())
    for path in plan.paths:
        module, what = required_module(path)
        if not _module_file(module):
            where = "installed" if path == "flashinfer" else f"in the installed vllm {package_version('vllm')}"
            raise PathUnavailable(
                f"the recipe asks for the '{path}' path but {what} ({module}) is not {where}; "
                "drop it from vllm.paths or pass --path"
            )


def check_release(paths: tuple[str, ...], version: str) -> None:
    """Refuse, in one line (``ReleaseUnsupported``, exit 36), a vLLM ``version`` outside ``releases.SUPPORTED``,
    a path that release lacks, or a path whose contact modules (plan/releases.py) are not on disk there: all
    before any compile. Only files are looked at, nothing of vLLM is imported (that takes a minute)."""
    release, supported = releases.minor(version), ", ".join(releases.SUPPORTED)
    head = f"vllm {version} is installed; kernelcache builds for vllm {supported}"
    if release not in releases.SUPPORTED:
        raise ReleaseUnsupported(f"{head}, not {release}: every path is affected ({', '.join(paths)}); install a "
                                 "supported vllm (scripts/setup.sh VLLM_VERSION=...)")
    lacking = [families.get(p) for p in paths if release not in families.get(p).about.releases]
    if lacking:
        why = "; ".join(dict.fromkeys(f.about.lacks for f in lacking if f.about.lacks))
        keep = " ".join(f"--path {p}" for p in paths if p not in {f.name for f in lacking})
        raise ReleaseUnsupported(f"{head}; {release} lacks the path(s) {', '.join(f.name for f in lacking)}"
                                 f"{f' ({why})' if why else ''}: build {keep or 'other paths'}")
    moved = [(p, c.symbol) for p in paths for c in releases.current(families.get(p).about.contacts, version)
             if not _module_file(c.module)]
    if moved:
        where = ", ".join(f"{symbol} ({path})" for path, symbol in moved)
        raise ReleaseUnsupported(f"{head}, but the installed vllm lacks {where}: it is not the {release} "
                                 "kernelcache knows; the path(s) affected cannot build")


def _module_file(module: str) -> bool:
    """Whether ``module`` is installed, found on disk below its top package: importing its parents here
    could fail for reasons that are no answer (vLLM's fused-MoE package imports C ops a CPU box lacks)."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    folders = list(spec.submodule_search_locations or ()) if spec else []
    if not rest:
        return spec is not None
    relative = Path(*rest.split("."))
    return any((Path(f) / relative).with_suffix(".py").is_file() or (Path(f) / relative / "__init__.py").is_file()
               for f in folders)


def plan_targets(plan: BuildPlan, arch: str, mode: str, gpus: list[VisibleGpu]) -> list[BuildTarget]:
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
        matching = tuple(p for p in profiles if p.sm_count == gpu.sm_count
                         and (not device_keyed(plan) or p.product == gpu.name))
        if profiles and not matching:
            names = ", ".join(p.name for p in profiles)
            what = "by name (the plan's kernels depend on it)" if device_keyed(plan) else f"({gpu.sm_count} SMs)"
            raise UsageError(f"the visible {gpu.name} matches none of the requested profiles ({names}) {what}; "
                             "use --mode cross to build for them")
        chosen = matching or (profile_for(gpu) or GpuProfile(f"local-{gpu.capability}", arch, gpu.sm_count, gpu.name),)
        return [BuildTarget(arch, gpu.sm_count, chosen, "native")]
    if not profiles:
        known = ", ".join(sorted({p.arch for p in plan.gpus}))
        fits = ", ".join(sorted(p.name for p in PROFILES.values() if p.arch == arch)) or "none is built in"
        raise UsageError(f"the plan's GPU profiles are for {known}, not {arch}; pass --gpu with a profile of {arch} "
                         f"({fits}) or define one in the recipe")
    by_sm: dict[tuple[int, str], list[GpuProfile]] = defaultdict(list)
    for p in profiles:
        by_sm[(p.sm_count, p.product if device_keyed(plan) else "")].append(p)
    return [BuildTarget(arch, sm, tuple(ps), "cross", product) for (sm, product), ps in sorted(by_sm.items())]
