"""A node's GPU as a container sees it, for a CPU-only machine: a ``libcuda.so.1`` that answers as one GPU.

On a GPU node the device plugin mounts the driver's ``libcuda.so.1`` into a container that asks for
``nvidia.com/gpu``. This one (built with the real gcc) answers the driver calls ``visible_gpus()`` makes
(kernelcache/plan/gpus.py: ``cuInit``, ``cuDeviceGetCount``, ``cuDeviceGet``, ``cuDeviceGetName``,
``cuDeviceGetAttribute``) with one device of a GPU profile; put its directory on ``LD_LIBRARY_PATH``. It is for
commands that pick by the visible GPU (``kernelcache install oci://…`` of an index), never for a process that
runs kernels.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from kernelcache.plan.gpus import profile

# CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
SOURCE = r"""
#include <string.h>
int cuInit(unsigned int flags) { return 0; }
int cuDeviceGetCount(int *count) { *count = 1; return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return ordinal == 0 ? 0 : 101; }
int cuDeviceGetName(char *name, int length, int device) { strncpy(name, "PRODUCT", length); return 0; }
int cuDeviceGetAttribute(int *value, int attribute, int device) {
  switch (attribute) {
    case 75: *value = MAJOR; return 0;
    case 76: *value = MINOR; return 0;
    case 16: *value = SMS; return 0;
  }
  *value = 0;
  return 1;
}
"""


def libcuda_for(gpu: str, where: Path) -> Path:
    """The directory holding a ``libcuda.so.1`` that shows one ``gpu`` (a profile name: ``h200``)."""
    chosen = profile(gpu)
    source = (SOURCE.replace("PRODUCT", chosen.product).replace("MAJOR", str(chosen.capability // 10))
              .replace("MINOR", str(chosen.capability % 10)).replace("SMS", str(chosen.sm_count)))
    where.mkdir(parents=True, exist_ok=True)
    (where / "libcuda.c").write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(where / "libcuda.so.1"), str(where / "libcuda.c")],
                   check=True, capture_output=True, timeout=120)
    return where
