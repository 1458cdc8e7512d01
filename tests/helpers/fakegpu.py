"""A visible GPU for install's GPU check on a machine without one: a stub ``libcuda.so.1`` that answers the
driver calls kernelcache's probe makes (plan/gpus.py ``_PROBE``: cuInit, cuDeviceGetCount, cuDeviceGet,
cuDeviceGetName, cuDeviceGetAttribute for the compute capability and the multiprocessor count) with the name,
capability and SM count in ``KC_FAKE_GPU_NAME``, ``KC_FAKE_GPU_CC`` and ``KC_FAKE_GPU_SMS``. Only the probe
loads it (LD_LIBRARY_PATH): nothing in these tests launches a kernel."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kernelcache.plan.gpus import GpuProfile

SOURCE = r"""
#include <stdlib.h>
#include <string.h>
int cuInit(unsigned int flags) { return getenv("KC_FAKE_GPU_NAME") ? 0 : 100; }
int cuDeviceGetCount(int *count) { *count = 1; return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int device) {
  strncpy(name, getenv("KC_FAKE_GPU_NAME"), len - 1); name[len - 1] = 0; return 0;
}
int cuDeviceGetAttribute(int *value, int attribute, int device) {
  int cc = atoi(getenv("KC_FAKE_GPU_CC"));
  if (attribute == 75) *value = cc / 10;        /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
  else if (attribute == 76) *value = cc % 10;   /* ..._MINOR */
  else if (attribute == 16) *value = atoi(getenv("KC_FAKE_GPU_SMS"));  /* ..._MULTIPROCESSOR_COUNT */
  else return 1;
  return 0;
}
"""


def build_stub(folder: Path) -> Path:
    """Compile the stub into ``folder`` (gcc, as the suite's other native builds); the folder to put on
    LD_LIBRARY_PATH."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.fail("a C compiler is needed to build the stub libcuda")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "stub.c").write_text(SOURCE)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"), str(folder / "stub.c")],
                   check=True)
    return folder


def env_for(stub: Path, profile: GpuProfile) -> dict[str, str]:
    """The variables under which the probe sees one GPU of ``profile``."""
    return {"LD_LIBRARY_PATH": str(stub), "KC_FAKE_GPU_NAME": profile.product,
            "KC_FAKE_GPU_CC": str(profile.capability), "KC_FAKE_GPU_SMS": str(profile.sm_count)}
