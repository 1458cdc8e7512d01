"""CPU seconds of the vLLM-importing child processes a first serve-command build starts before its exercises.

before: the child that configures the serve command (exercise/vllm_serve.py), then the preflight's import child
(preflight.py ``import_errors``). after: the configuring child alone, which also imports what the preflight row
would (``IMPORTABLE``) once its answer is written. CPU time is the children's user + system time
(``RUSAGE_CHILDREN``): steadier than wall time on a shared box.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_serve_children.py scripts/gpu/models/llama-tiny 2
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from kernelcache.exercise import vllm_serve
from kernelcache.plan.gpus import memory_mib
from kernelcache.plan.gpus import profile as gpu_profile
from kernelcache.preflight import IMPORTABLE, import_errors


def children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(run):
    cpu, wall = children(), time.perf_counter()
    out = run()
    return round(children() - cpu, 2), round(time.perf_counter() - wall, 2), out


def main(model: Path, rounds: int) -> None:
    g = gpu_profile("h100-sxm")
    request = {"args": [str(model), "--max-num-seqs", "16"], "shown": f"vllm serve {model} --max-num-seqs 16",
               "profiles": [{"name": g.name, "arch": g.arch, "product": g.product, "sm_count": g.sm_count,
                             "memory_mib": memory_mib(g)}]}
    for i in range(rounds):  # interleaved: each round measures both
        serve_cpu, serve_wall, _ = timed(lambda: vllm_serve._run_child(request, []))
        import_cpu, import_wall, failed = timed(lambda: import_errors(list(IMPORTABLE)))
        print(json.dumps({"round": i, "before_cpu_s": round(serve_cpu + import_cpu, 2), "serve_cpu_s": serve_cpu,
                          "preflight_cpu_s": import_cpu, "wall_s": round(serve_wall + import_wall, 2),
                          "failed": failed}), flush=True)
        cpu, wall, (_, imported) = timed(lambda: vllm_serve._run_child(request, list(IMPORTABLE)))
        print(json.dumps({"round": i, "after_cpu_s": cpu, "wall_s": wall, "imported": imported}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2)
