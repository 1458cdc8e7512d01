"""Pick the bundle for this machine out of an index: a pure function of what the index lists,
the visible GPUs (or an explicit ``--arch`` / ``--gpu``) and this platform.

The rules, in order:

1. Bundles for another platform (launchers are native code: x86_64 vs aarch64) never qualify.
2. What is wanted: ``--gpu NAME`` means that profile's arch and SM count; ``--arch`` alone means
   that arch; neither means the visible GPUs, which must all be of one arch and SM count.
3. A bundle built for exactly that SM count wins (by profile name first, where one is known),
   then a bundle built for the arch alone (no SM count: its kernels do not depend on it). With
   only ``--arch`` given, a single bundle for that arch qualifies whatever its SM count. A bundle whose
   kernels the device name decided (a ``serves`` note: the moe and mamba paths) qualifies only for the
   device names it serves: the wanted profile's, or the visible GPU's.
4. Nothing qualifying is an ``ArchMismatch`` that lists what the index has: installing another
   arch's bundle would recompile everything.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ArchMismatch, UsageError
from ..format.manifest import arch_to_capability, flag_capability
from ..plan.gpus import VisibleGpu, profile, profile_for


@dataclass(frozen=True)
class Candidate:
    """One bundle an index lists: what it was built for and how to fetch it."""

    arch: str  # "sm_90"
    gpu: str | None = None  # GPU profile name, when the build depended on it
    sm_count: int | None = None
    platform: str | None = None  # "x86_64-linux"
    reference: str = ""  # a digest or a tag
    serves: tuple[str, ...] | None = None  # device names, where the device name decided its kernels

    def fits(self, device: str | None) -> bool:
        """Whether it serves ``device`` (None, only ``--arch`` given: install's own GPU check decides)."""
        return self.serves is None or device is None or device in self.serves

    @property
    def capability(self) -> int:
        return arch_to_capability(self.arch)

    @property
    def label(self) -> str:
        gpu = f" ({self.gpu}, {self.sm_count} SMs)" if self.gpu else ""
        gpu = gpu or (f" ({self.sm_count} SMs)" if self.sm_count else "")
        return f"{self.arch}{gpu}" + (f" [{self.platform}]" if self.platform else "")


@dataclass(frozen=True)
class Wanted:
    capability: int
    sm_count: int | None = None
    gpu: str | None = None  # a profile name to prefer among equal SM counts
    why: str = ""
    device: str | None = None  # the device name: the visible GPU's, or the profile's product

    @property
    def label(self) -> str:
        extra = f", {self.sm_count} SMs" if self.sm_count else ""
        return f"sm_{self.capability}{extra} ({self.why})"


def wanted(gpus: list[VisibleGpu], arch: str | None = None, gpu: str | None = None) -> Wanted:
    """What this machine needs, from an explicit arch or GPU profile, else from the visible GPUs."""
    if gpu is not None:
        chosen = profile(gpu)
        if arch is not None and arch_to_capability(arch) != chosen.capability:
            raise UsageError(f"--arch {arch} contradicts --gpu {chosen.name}, which is {chosen.arch}")
        return Wanted(chosen.capability, chosen.sm_count, chosen.name, f"--gpu {chosen.name}", chosen.product)
    if arch is not None:
        return Wanted(flag_capability(arch, None), why=f"--arch {arch}")
    kinds = sorted({(g.capability, g.sm_count) for g in gpus})
    if not kinds:
        raise UsageError("no GPU is visible here to pick a bundle from the index; pass --arch or --gpu")
    if len(kinds) > 1:
        shown = ", ".join(f"sm_{c}/{s} SMs" for c, s in kinds)
        raise UsageError(f"GPUs of different kinds are visible ({shown}); pick one with --gpu or CUDA_VISIBLE_DEVICES")
    first = gpus[0]
    match = profile_for(first)
    return Wanted(first.capability, first.sm_count, match.name if match else None, f"visible GPU {first.name}",
                  first.name)


def choose(candidates: list[Candidate], gpus: list[VisibleGpu], arch: str | None = None, gpu: str | None = None,
           platform: str | None = None) -> Candidate:
    """The one candidate to install here, or a clear error saying why none fits."""
    want = wanted(gpus, arch, gpu)
    usable = [c for c in candidates if platform is None or c.platform in (None, platform)]
    same_arch = [c for c in usable if c.capability == want.capability and c.fits(want.device)]
    exact = [c for c in same_arch if want.sm_count is not None and c.sm_count == want.sm_count]
    if exact:
        return sorted(exact, key=lambda c: (c.gpu != want.gpu, c.gpu or ""))[0]
    generic = [c for c in same_arch if c.sm_count is None]
    if generic:
        return generic[0]
    if want.sm_count is None and len(same_arch) == 1:
        return same_arch[0]
    if want.sm_count is None and same_arch:
        names = ", ".join(c.gpu or c.label for c in same_arch)
        raise UsageError(f"the index has several bundles for sm_{want.capability} ({names}); pick one with --gpu")
    listed = ", ".join(c.label for c in candidates) or "nothing"
    device = f" ({want.device})" if any(not c.fits(want.device) for c in usable) else ""
    raise ArchMismatch(
        f"the index has no bundle for {want.label}{device}{_platform_note(candidates, usable, platform)}; "
        "installing another one would recompile every kernel",
        [("bundle for", listed, want.label)],
    )


def _platform_note(candidates: list[Candidate], usable: list[Candidate], platform: str | None) -> str:
    return f" on {platform}" if platform and len(usable) < len(candidates) else ""
