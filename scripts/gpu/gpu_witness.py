"""What kernelcache's checked-install record (cachedir/checked.py) sees of this host's GPUs: the visible GPUs
(``plan.gpus.visible_gpus``), the driver's per-GPU witness files and the NVIDIA device nodes.

    python3 scripts/gpu/gpu_witness.py
"""

from __future__ import annotations

import os

from kernelcache.plan.gpus import visible_gpus

GPUS = "/proc/driver/nvidia/gpus"

print("visible:", [(g.name, g.arch, g.sm_count) for g in visible_gpus()])
print("witness files:", sorted(os.listdir(GPUS)) if os.path.isdir(GPUS) else None)
print("dev:", sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")))
