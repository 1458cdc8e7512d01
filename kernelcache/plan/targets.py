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

from ..errors import PathUnavailable, UsageError
from ..format.fingerprint import package_version
from ..format.manifest import DEVICE_NAME_PATHS, arch_to_capability
from .gpus import PROFILES, GpuProfile, VisibleGpu, profile_for
from .recipe import BuildPlan

REQUIRED_MODULES = {
    "registry": ("vllm.model_executor.warmup.jit_warmup", "vLLM's JIT warmup registry"),
    "mrv1": ("vllm.v1.sample.sampler", "the V1 (MRV1) Sampler"),
    "mrv2": ("vllm.v1.worker.gpu.sample.gumbel", "Model Runner V2's Gumbel sampler"),
    "flashinfer": ("flashinfer", "flashinfer-python"),
    "mrv1_spec_decode": ("vllm.v1.spec_decode.utils", "vLLM's speculative-decoding kernels"),
    "mrv2_spec_decode": ("vllm.v1.worker.gpu.spec_decode.rejection_sampler",
                         "Model Runner V2's speculative decoding"),
    "moe": ("vllm.model_executor.layers.fused_moe.fused_moe", "vLLM's fused-MoE Triton kernels"),
    "runner": ("vllm.v1.worker.gpu.input_batch", "Model Runner V2's input batch"),
    "attention": ("vllm.v1.attention.backends.triton_attn", "vLLM's Triton attention backend"),
    "mamba": ("vllm.model_executor.layers.mamba.mamba_mixer2", "vLLM's Mamba-2 mixer"),
    "gdn": ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "vLLM's gated-delta-net layer"),
    "flashinfer_attention": ("vllm.v1.attention.backends.flashinfer", "vLLM's FlashInfer attention backend"),
}


def device_keyed(plan: BuildPlan) -> bool:
    """Whether the plan has a path vLLM configures by device name (a path that reads such a table but is not in
    ``DEVICE_NAME_PATHS`` fails its build, build.py ``device_keys_of``, rather than mislabel a bundle)."""
    return any(p in DEVICE_NAME_PATHS for p in plan.paths)


@dataclass(frozen=True)
class BuildTarget:
    arch: str
    sm_count: int
    profiles: tuple[GpuProfile, ...]
    mode: str  # "cross" | "native"
    product: str = ""  # set when the keys depend on the product name (DEVICE_NAME_PATHS)

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
        raise PathUnavailable("vLLM is not installed here; `kernelcache build` runs vLLM's own sampler code")
    for path in plan.paths:
        module, what = REQUIRED_MODULES[path]
        if not _module_file(module):
            where = "installed" if path == "flashinfer" else f"in the installed vllm {package_version('vllm')}"
            raise PathUnavailable(
                f"the recipe asks for the '{path}' path but {what} ({module}) is not {where}; "
                "drop it from vllm.paths or pass --path"
            )


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
