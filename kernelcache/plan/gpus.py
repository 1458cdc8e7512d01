"""GPU profiles (name -> arch, SM count) and detection of the GPUs this machine can see.

The SM count matters because vLLM's split top-p kernels pick their split factor from it, so a
bundle is keyed by GPU model as well as by arch. Detection talks to libcuda through ctypes in a
short-lived child process: initialising CUDA in the caller would make a later fork() (vLLM's
default for workers) unusable, and importing torch just to ask would cost seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class GpuProfile:
    name: str
    arch: str  # "sm_90"
    sm_count: int
    product: str  # what the driver calls it

    @property
    def capability(self) -> int:
        from ..bundle.manifest import arch_to_capability

        return arch_to_capability(self.arch)


# SM counts from NVIDIA's product briefs / whitepapers (multiprocessor count as CUDA reports it).
PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        GpuProfile("a100", "sm_80", 108, "NVIDIA A100"),
        GpuProfile("a10g", "sm_86", 80, "NVIDIA A10G"),
        GpuProfile("l4", "sm_89", 58, "NVIDIA L4"),
        GpuProfile("l40s", "sm_89", 142, "NVIDIA L40S"),
        GpuProfile("h100-sxm", "sm_90", 132, "NVIDIA H100 80GB HBM3"),
        GpuProfile("h100-pcie", "sm_90", 114, "NVIDIA H100 PCIe"),
        GpuProfile("h200", "sm_90", 132, "NVIDIA H200"),
        GpuProfile("h20", "sm_90", 78, "NVIDIA H20"),
        GpuProfile("b200", "sm_100", 148, "NVIDIA B200"),
        GpuProfile("rtx-pro-6000", "sm_120", 188, "NVIDIA RTX PRO 6000 Blackwell"),
    )
}


def profile(name: str) -> GpuProfile:
    try:
        return PROFILES[name.lower()]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise UsageError(f"unknown GPU profile {name!r} (known: {known})") from None


@dataclass(frozen=True)
class VisibleGpu:
    index: int
    name: str
    capability: int  # 90 for sm_90
    sm_count: int

    @property
    def arch(self) -> str:
        return f"sm_{self.capability}"


_PROBE = r"""
import ctypes, json
out = []
try:
    cu = ctypes.CDLL("libcuda.so.1")
    if cu.cuInit(0) == 0:
        n = ctypes.c_int(0)
        cu.cuDeviceGetCount(ctypes.byref(n))
        for i in range(n.value):
            dev = ctypes.c_int(0)
            cu.cuDeviceGet(ctypes.byref(dev), i)
            name = ctypes.create_string_buffer(256)
            cu.cuDeviceGetName(name, 256, dev)
            vals = []
            for attr in (75, 76, 16):  # compute capability major, minor; multiprocessor count
                v = ctypes.c_int(0)
                cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev)
                vals.append(v.value)
            out.append({"index": i, "name": name.value.decode(), "capability": vals[0] * 10 + vals[1],
                        "sm_count": vals[2]})
except OSError:
    pass
print(json.dumps(out))
"""


def visible_gpus() -> list[VisibleGpu]:
    """The GPUs CUDA would show a new process here (honours CUDA_VISIBLE_DEVICES)."""
    return GpuProbe.start().result()


class GpuProbe:
    """``visible_gpus()`` in two halves: start the child process now, read its answer later, so the
    caller's own work (reading a bundle) overlaps the child's start. ``-I -S``: the probe needs only
    the standard library, so it skips site-packages and their .pth files."""

    def __init__(self, child: subprocess.Popen | None):
        self.child = child

    @classmethod
    def start(cls) -> GpuProbe:
        if os.environ.get("KERNELCACHE_NO_GPU_PROBE"):
            return cls(None)
        try:
            child = subprocess.Popen([sys.executable, "-I", "-S", "-c", _PROBE], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return cls(None)
        return cls(child)

    def result(self) -> list[VisibleGpu]:
        if self.child is None:
            return []
        try:
            stdout, _ = self.child.communicate(timeout=60)
            rows = json.loads(stdout or "[]")
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.child.kill()
            self.child.wait()
            return []
        return [VisibleGpu(**row) for row in rows]

    def close(self) -> None:
        """Stop a probe whose answer is no longer wanted (the caller failed first)."""
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        if self.child is not None and self.child.stdout:
            self.child.stdout.close()


def profile_for(gpu: VisibleGpu) -> GpuProfile | None:
    """The profile matching a visible GPU by arch and SM count."""
    for p in PROFILES.values():
        if p.capability == gpu.capability and p.sm_count == gpu.sm_count and p.product in gpu.name:
            return p
    for p in PROFILES.values():
        if p.capability == gpu.capability and p.sm_count == gpu.sm_count:
            return p
    return None
