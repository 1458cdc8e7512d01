"""One process launching a real ``@triton.autotune`` kernel with Triton's autotune disk cache on, for sm_90.

    python autotune_disk.py BLOCKS [--guard | --activate CACHE_DIR] [--log]

``BLOCKS``: the candidate configs, as comma-separated ``BLOCK`` sizes (each ``num_warps=4``). The kernel is
launched once through ``Autotuner.run`` on CPU tensors behind kernelcache's fake sm_90 target (launches are
no-ops). With ``TRITON_CACHE_AUTOTUNING=1`` in the environment, Triton computes the tuning key from the arguments
and the disk-cache key from itself, the fake target's backend, the kernel source, the variables and the
candidates (``Autotuner.check_disk_cache``), and reads or writes ``<key dir>/scaled_copy.autotune.json`` under
``TRITON_CACHE_DIR``; then it compiles the chosen config.

What is faked, and why: the fake target has no clock, so the benchmark is the autotuner's own ``do_bench`` hook
(``triton.autotune(do_bench=...)``) returning a fixed time per ``BLOCK`` (smaller is faster: 64 wins over 32 and
128; nothing is launched) and recording each call. Everything else is Triton's: the keys, the file, its read.

``--guard``: kernelcache's served guard (hooks/kernelcache_autotune.py) wraps the autotuner first, as
``kernelcache env`` / ``run`` arrange (through sitecustomize) where a bundle's choices are installed.
``--activate CACHE_DIR``: ``kernelcache.activate(cache_dir=...)`` first, as an in-process user calls it. Prints one
JSON line: the configs benchmarked, the config chosen, whether the guard wrapped the autotuner, the autotune files
under the cache dir; a Triton error escapes. ``--log``: kernelcache's autotune log (exercise/autotune_log.py) records
too, and its records are printed under ``log``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TIMES = {16: 4.0, 32: 3.0, 64: 1.0, 128: 2.0}  # made-up milliseconds per BLOCK: 64 is the fastest


def main() -> int:
    blocks = [int(b) for b in sys.argv[1].split(",")]
    guard = "--guard" in sys.argv[2:]
    if "--activate" in sys.argv[2:]:
        import kernelcache

        kernelcache.activate(cache_dir=sys.argv[sys.argv.index("--activate") + 1])
    import torch
    import triton
    import triton.language as tl

    from kernelcache.exercise import fake_target

    fake_target.activate(90, 132, prebuild=False)
    if guard:
        from triton.runtime import autotuner

        from kernelcache.hooks import kernelcache_autotune

        kernelcache_autotune.guard(autotuner)
    benched: list[str] = []
    logged: list[dict] = []
    if "--log" in sys.argv[2:]:
        from kernelcache.exercise import autotune_log

        autotune_log.install(also=logged.append)

    def do_bench(kernel_call, quantiles=None):
        config = next(c for c in kernel.configs if str(c) == current[0])
        benched.append(str(config))
        ms = TIMES[config.kwargs["BLOCK"]]
        return [ms, ms, ms]

    current: list[str] = [""]
    configs = [triton.Config({"BLOCK": b}, num_warps=4) for b in blocks]

    @triton.autotune(configs=configs, key=["n"], do_bench=do_bench)
    @triton.jit
    def scaled_copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    kernel = scaled_copy
    original = kernel._bench

    def bench(*args, config, **meta):
        current[0] = str(config)
        return original(*args, config=config, **meta)

    kernel._bench = bench
    x = torch.ones(4096, dtype=torch.float32)
    kernel[lambda meta: (triton.cdiv(4096, meta["BLOCK"]),)](x, torch.empty_like(x), 4096)
    root = Path(os.environ["TRITON_CACHE_DIR"])
    files = sorted(f"{p.parent.name}/{p.name}" for p in root.glob("*/*.autotune.json"))
    guarded = getattr(type(kernel).check_disk_cache, "kernelcache_guarded", False)
    print(json.dumps({"benched": benched, "chosen": str(kernel.best_config), "guarded": guarded, "files": files,
                      "log": [{k: r[k] for k in r if k not in ("pid", "time", "task")} for r in logged]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
