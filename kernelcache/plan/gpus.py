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
        from ..format.manifest import arch_to_capability

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


# Device memory as the driver reports it (MiB, ``cudaDeviceProp.totalGlobalMem``): vLLM sizes its default batch
# limits by it (``EngineArgs.get_batch_defaults``), so a serve command is resolved with the product's memory. A
# profile defined in a recipe ([gpu.NAME]) is taken as an 80 GB part.
MEMORY_MIB = {"a100": 81920, "a10g": 23028, "l4": 23034, "l40s": 46068, "h100-sxm": 81559, "h100-pcie": 81559,
              "h200": 143771, "h20": 97871, "b200": 183359, "rtx-pro-6000": 97887}
DEFAULT_MEMORY_MIB = 81559


def memory_mib(gpu: GpuProfile) -> int:
    return MEMORY_MIB.get(gpu.name, DEFAULT_MEMORY_MIB)


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


_STAMP_PROBE = r"""
import ctypes, json, sys
out = {}
try:
    cu = ctypes.CDLL("libcuda.so.1")
    if cu.cuInit(0) == 0:
        dev, version = ctypes.c_int(0), ctypes.c_int(0)
        cu.cuDeviceGet(ctypes.byref(dev), int(sys.argv[1]))
        if cu.cuDriverGetVersion(ctypes.byref(version)) == 0:
            out["cuda"] = f"{version.value // 1000}.{version.value % 1000 // 10}"
        bus = ctypes.create_string_buffer(64)
        if cu.cuDeviceGetPCIBusId(bus, 64, dev) == 0:
            out["pci"] = bus.value.decode()
        for name, attr in (("max_sm", 13), ("max_memory", 36)):  # CLOCK_RATE, MEMORY_CLOCK_RATE (kHz)
            value = ctypes.c_int(0)
            if cu.cuDeviceGetAttribute(ctypes.byref(value), attr, dev) == 0 and value.value > 0:
                out[name] = value.value // 1000
except OSError:
    pass
print(json.dumps(out))
"""
_SMI_FIELDS = {"driver_version": None, "clocks.applications.graphics": "sm", "clocks.applications.memory": "memory",
               "clocks.max.sm": "max_sm", "clocks.max.memory": "max_memory"}


@dataclass(frozen=True)
class GpuStamp:
    """Where timings were taken: the GPU's product, driver and clocks (MHz)."""

    product: str
    driver: str | None  # the NVIDIA driver's version, from nvidia-smi
    cuda: str | None  # the CUDA version the driver supports (cuDriverGetVersion)
    clocks: dict[str, int]


def stamp(gpu: VisibleGpu) -> GpuStamp:
    """The stamp of the visible GPU ``gpu``: libcuda in a child process (as ``visible_gpus``) for the CUDA version,
    the PCI bus and the peak clocks; nvidia-smi, where it is installed, for the driver version and the application
    and maximum clocks of that bus (which replace libcuda's)."""
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _STAMP_PROBE, str(gpu.index)],
                              capture_output=True, text=True, timeout=60)
        found = json.loads(done.stdout or "{}")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        found = {}
    clocks = {k: v for k, v in found.items() if k in ("max_sm", "max_memory") and isinstance(v, int)}
    driver, smi = _nvidia_smi(found.get("pci"))
    return GpuStamp(gpu.name, driver, found.get("cuda"), {**clocks, **smi})


def _nvidia_smi(pci: str | None) -> tuple[str | None, dict[str, int]]:
    """The driver version and clocks nvidia-smi reports for the GPU on PCI bus ``pci`` (None, {} without it)."""
    if not pci:
        return None, {}
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu=pci.bus_id,{','.join(_SMI_FIELDS)}",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None, {}
    for line in done.stdout.splitlines():
        bus, *values = (v.strip() for v in line.split(","))
        if _bus(bus) == _bus(pci) and len(values) == len(_SMI_FIELDS):
            named = dict(zip(_SMI_FIELDS.values(), values))
            return named.pop(None) or None, {k: int(v) for k, v in named.items() if v.isdigit()}
    return None, {}


def _bus(address: str) -> str:
    """A PCI address without the domain's leading zeros ("00000000:19:00.0" and "0000:19:00.0" are one bus)."""
    domain, *rest = address.strip().lower().split(":")
    return ":".join([domain.lstrip("0"), *rest])
