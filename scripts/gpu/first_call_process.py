#!/usr/bin/env python3
"""One fresh process of scripts/gpu/first_call_rounds.py: a sampler path's first call, timed as a user's process
meets it, and the busy phase's matmul loop.

    python3 scripts/gpu/first_call_process.py PATH [--profile] [--wait] [--pin CPU] [--fake]   # one RESULT line
    python3 scripts/gpu/first_call_process.py --gpu-work [--pin CPU]     # WORK seconds -> DONE, on stdin/stdout

PATH: ``k`` (vLLM's ``apply_top_k_top_p_triton`` alone, top-k and top-p), ``mrv1`` (three ``Sampler`` calls at
B=16: top-k+top-p, top-k, top-p, each with 16 seeded CUDA generators made in the call) or ``mrv2`` (MRV2's seeded
chain: temperature, min-p, top-k/top-p, Gumbel, in four modes: k+p, k, p, none); logits as the LM head returns
them (fp32, rows padded to 64 columns). Before the clock: ``import torch``, CUDA init, the imports, ``Sampler()``,
the inputs; ``--wait``: then say READY and wait for GO on stdin. The clock runs from a ``torch.cuda.synchronize()``
to the one after the last call. The process also times, without cProfile, where its first call goes (``Phases``:
triton_key, each kernel's ``cache_key`` walk, compile()'s hit path, module loads, helper modules, the driver's
start, generator set-up, GC pauses), counts what the call used besides wall time (``Usage``: CPU time, page faults,
context switches), counts compiles with kernelcache's compile listener and the commands it starts (``Watch``);
``--profile``: its first call under cProfile. ``KC_GC_FREEZE=1``: the GC heap frozen before the clock, as vLLM's
EngineCore does once started (``freeze_gc_heap``). ``--fake``: a CPU dry run under kernelcache's fake sm_90 target
(no GPU; kernels compiled, not run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

BATCH, VOCAB, PADDING = 16, 50257, 64
PATHS = ("k", "mrv1", "mrv2")
MRV1_MODES = ("top_k_top_p", "top_k", "top_p")
MRV2_MODES = ("top_k_top_p", "top_k", "top_p", "none")


class Phases:
    """Wall time spent in named functions, split at the clock: inclusive, per call, with a detail (kernel name)."""

    def __init__(self):
        self.clock: float | None = None  # perf_counter at the start of the timed call
        self.stop: float | None = None
        self.calls: list[tuple[str, float, float, str]] = []  # (phase, start, seconds, detail)

    def wrap(self, owner, name: str, phase: str, detail=None):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.calls.append((phase, start, time.perf_counter() - start,
                                   detail(*args, **kwargs) if detail else ""))

        timed.__wrapped__ = original
        setattr(owner, name, timed)

    def summary(self) -> dict:
        """Per phase, calls and seconds (and by detail) before the clock and in the first call; the second call's
        are left out."""
        inside, before = {}, {}
        for phase, start, seconds, detail in self.calls:
            if self.clock is not None and start > (self.stop or 1e30):
                continue
            target = inside if self.clock is not None and start >= self.clock else before
            entry = target.setdefault(phase, {"calls": 0, "seconds": 0.0, "by": {}})
            entry["calls"] += 1
            entry["seconds"] += seconds
            if detail:
                entry["by"][detail] = round(entry["by"].get(detail, 0.0) + seconds, 6)
        for table in (inside, before):
            for entry in table.values():
                entry["seconds"] = round(entry["seconds"], 6)
        return {"first_call_phases": inside, "before_clock_phases": before}


def _name(fn) -> str:
    return getattr(fn, "_fn_name", None) or getattr(getattr(fn, "fn", None), "__name__", "") or type(fn).__name__


def install_phases(phases: Phases) -> None:
    """Time the parts of Triton's first-call path (module attributes and classes, so nothing runs early)."""
    import triton.compiler as compiler_pkg
    import triton.compiler.compiler as compiler
    import triton.runtime.cache as cache
    import triton.runtime.jit as jit
    from triton.backends.nvidia import compiler as nvidia_compiler
    from triton.backends.nvidia import driver as nvidia_driver

    phases.wrap(cache, "triton_key", "triton_key")
    try:
        import triton.runtime.autotuner as autotuner

        autotuner.triton_key = cache.triton_key
    except ImportError:
        pass
    phases.wrap(compiler, "get_cache_key", "get_cache_key")
    phases.wrap(compiler, "make_backend", "make_backend")
    phases.wrap(compiler, "get_cache_manager", "get_cache_manager")
    phases.wrap(compiler_pkg, "compile", "compile", lambda src, *a, **k: getattr(src, "name", ""))
    compiler.compile = compiler_pkg.compile
    phases.wrap(cache.FileCacheManager, "get_group", "cache_get_group")
    phases.wrap(compiler.CompiledKernel, "__init__", "compiled_kernel_read", lambda self, src, *a: src.name)
    phases.wrap(compiler.CompiledKernel, "_init_handles", "init_handles", lambda self: self.name)
    phases.wrap(nvidia_compiler.CUDABackend, "hash", "backend_hash")
    phases.wrap(nvidia_driver, "compile_module_from_src", "helper_module_load",
                lambda *a, **k: k.get("name") or (a[1] if len(a) > 1 else ""))
    phases.wrap(nvidia_driver.CudaLauncher, "__init__", "launcher_init")
    phases.wrap(nvidia_driver, "libcuda_dirs", "libcuda_dirs")
    import triton.runtime.build as build

    phases.wrap(build, "platform_key", "platform_key")
    phases.wrap(nvidia_driver.CudaDriver, "__init__", "driver_init")
    _time_load_binary(phases, nvidia_driver)
    phases.wrap(jit.JITFunction, "run", "jit_run", lambda self, *a, **k: _name(self))
    phases.wrap(jit.JITFunction, "create_binder", "create_binder", lambda self: _name(self))
    _time_cache_key(phases, jit)


def _time_load_binary(phases: Phases, nvidia_driver) -> None:
    """``CudaUtils.load_binary`` (cuModuleLoadData) is set on the instance from the C module: wrap it there."""
    original_init = nvidia_driver.CudaUtils.__init__

    def init(self, *args, **kwargs):
        start = time.perf_counter()
        original_init(self, *args, **kwargs)
        phases.calls.append(("cuda_utils_init", start, time.perf_counter() - start, ""))
        phases.wrap(self, "load_binary", "module_load", lambda name, *a: name)

    nvidia_driver.CudaUtils.__init__ = init


def _time_cache_key(phases: Phases, jit) -> None:
    """Each ``JITCallable.cache_key`` computed here (a walk, or kernelcache's replay), outermost ones by kernel."""
    prop = jit.JITCallable.__dict__["cache_key"]
    depth = threading.local()

    def cache_key(fn):
        if fn.hash is not None:
            return prop.fget(fn)
        level = getattr(depth, "n", 0)
        depth.n, start = level + 1, time.perf_counter()
        try:
            return prop.fget(fn)
        finally:
            depth.n = level
            if level == 0:
                phases.calls.append(("cache_key", start, time.perf_counter() - start, _name(fn)))

    jit.JITCallable.cache_key = property(cache_key)


class Watch:
    """What the first call does besides time: compiles and hits, gcc builds, commands, libtriton reads, GC pauses."""

    def __init__(self):
        self.on = False
        self.events: list[dict] = []
        self.spawned: list[list[str]] = []
        self.read_libtriton = False
        self.gc_seconds, self.gc_collections, self._gc_start = 0.0, [0, 0, 0], 0.0
        self.builds: list[str] = []

    def install(self) -> None:
        import gc

        import kernelcache.format.manifest  # noqa: F401 -- what the listener's first record imports: not on the clock
        from kernelcache.hooks import kernelcache_listener

        kernelcache_listener.install(also=lambda record: self.on and self.events.append(record))
        kernelcache_listener.count_builds(also=self._built)
        sys.addaudithook(self._audit)
        gc.callbacks.append(self._gc)

    def _built(self, record: dict) -> None:
        if self.on:
            self.builds.append(f"{record['name']}:{'copied' if record['event'] == 'prebuilt' else 'gcc'}")

    def _audit(self, event, args) -> None:
        if not self.on:
            return
        if event == "subprocess.Popen":
            self.spawned.append([str(a) for a in args[1]])
        elif event == "open" and isinstance(args[0], str) and "libtriton" in args[0]:
            self.read_libtriton = True

    def _gc(self, phase, info) -> None:
        if not self.on:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self._gc_start
            self.gc_collections[info["generation"]] += 1

    def result(self) -> dict:
        hits = sum(e["cache_hit"] for e in self.events)
        return {"compiles": len(self.events) - hits, "hits": hits,
                "kernels": sorted({f"{e['name']}:{e['key'][:8]}" for e in self.events}), "builds": self.builds,
                "spawned": self.spawned, "read_libtriton": self.read_libtriton,
                "gc_seconds": round(self.gc_seconds, 6), "gc_collections": self.gc_collections}


class Usage:
    """What the process used from here on, besides wall time: CPU time (all its threads, and this thread alone, which
    runs the call), page faults and context switches. Two processes doing the same work use the same CPU time and
    faults however the machine's speed varies between them."""

    def __init__(self):
        self.start = self._now()

    @staticmethod
    def _now() -> dict:
        import resource

        used = resource.getrusage(resource.RUSAGE_SELF)
        return {"cpu_ms": time.process_time() * 1000, "thread_cpu_ms": time.thread_time() * 1000,
                "minflt": used.ru_minflt, "majflt": used.ru_majflt, "vcsw": used.ru_nvcsw, "ivcsw": used.ru_nivcsw}

    def since(self) -> dict:
        now = self._now()
        return {name: round(now[name] - self.start[name], 3) for name in now}


FAKE = False  # --fake: a CPU dry run under kernelcache's fake sm_90 target (no GPU; kernels compiled, not run)


def padded_logits(dtype):
    """Logits as vLLM's LM head returns them: rows padded to a multiple of 64 columns, then sliced."""
    import torch

    padded = -(-VOCAB // PADDING) * PADDING
    gen = None if FAKE else torch.Generator(device="cuda").manual_seed(1234)
    return (torch.randn((BATCH, padded), generator=gen, device="cuda", dtype=torch.float32) * 3).to(dtype)[:, :VOCAB]


def generator(seed: int):
    """A request's seeded generator: a CUDA one (a CPU one in a dry run: CPU torch has none)."""
    import torch

    return torch.Generator(device="cpu" if FAKE else "cuda").manual_seed(seed)


def scenario(path: str, phases: Phases, marks: list):
    """The path's first call as a function (everything it needs is made here, before the clock)."""
    import torch

    logits = padded_logits(torch.float32)

    def full(value, dtype=None):
        return torch.full((BATCH,), value, device="cuda", dtype=dtype)

    if path == "k":
        from vllm.v1.sample.ops.topk_topp_triton import apply_top_k_top_p_triton

        k, p = full(50, torch.int32), full(0.9, torch.float32)

        def step():
            out = apply_top_k_top_p_triton(logits.clone(), k, p)
            marks.append(("top_k_top_p", time.perf_counter()))
            return out.argmax(dim=-1)
        return step
    if path == "mrv1":
        return _mrv1(logits, full, phases, marks)
    return _mrv2(logits, full, marks)


def _mrv1(logits, full, phases: Phases, marks: list):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    sampler = Sampler()
    filters = {"top_k_top_p": (full(50), full(0.9)), "top_k": (full(50), None), "top_p": (None, full(0.9))}

    def step():
        tokens = []
        for mode in MRV1_MODES:
            start = time.perf_counter()
            generators = {i: generator(1000 + i) for i in range(BATCH)}
            phases.calls.append(("generators", start, time.perf_counter() - start, mode))
            top_k, top_p = filters[mode]
            metadata = SamplingMetadata(
                temperature=full(0.5), all_greedy=False, all_random=True, top_p=top_p, top_k=top_k,
                generators=generators, max_num_logprobs=None, logprob_token_ids=None, no_penalties=True,
                prompt_token_ids=None, frequency_penalties=full(0.0), presence_penalties=full(0.0),
                repetition_penalties=full(1.0), output_token_ids=[[] for _ in range(BATCH)],
                spec_token_ids=[[] for _ in range(BATCH)], allowed_token_ids_mask=None, bad_words_token_ids={},
                logitsprocs=LogitsProcessors())
            tokens.append(sampler(logits=logits.clone(), sampling_metadata=metadata).sampled_token_ids)
            marks.append((mode, time.perf_counter()))
        return torch.cat([t.view(-1) for t in tokens])
    return step


def _mrv2(logits, full, marks: list):
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample
    from vllm.v1.worker.gpu.sample.min_p import apply_min_p

    mapping = torch.arange(BATCH, dtype=torch.int64, device="cuda")
    temperature, min_p = full(0.7, torch.float32), full(0.1, torch.float32)
    top_k, top_p = full(50, torch.int32), full(0.9, torch.float32)
    seeds = torch.arange(BATCH, dtype=torch.int64, device="cuda") + 1234
    pos = torch.full((BATCH,), 10, dtype=torch.int64, device="cuda")

    def step():
        tokens = []
        for mode in MRV2_MODES:
            use_k, use_p = mode in ("top_k_top_p", "top_k"), mode in ("top_k_top_p", "top_p")
            x = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
            apply_temperature(x, mapping, temperature)
            apply_min_p(x, mapping, min_p)
            x = apply_top_k_top_p(x, top_k if use_k else None, top_p if use_p else None,
                                  has_topp_only_rows=use_p and not use_k)
            tokens.append(gumbel_sample(x, mapping, temperature, seeds, pos, apply_temperature=False,
                                        is_drafting=False))
            marks.append((mode, time.perf_counter()))
        return torch.cat([t.view(-1) for t in tokens])
    return step


def child(path: str, profile: bool, wait: bool, pin: int | None = None) -> dict:
    """One fresh process: set up, say READY, wait for GO, time the first and second call; the result as a dict."""
    started = time.perf_counter()
    import torch

    sync = _fake_target() if FAKE else torch.cuda.synchronize
    if not FAKE:
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        sync()
    import triton

    phases, watch, marks = Phases(), Watch(), []
    install_phases(phases)
    watch.install()
    phases.wrap(triton.knobs.compilation, "listener", "compile_listener")  # this harness's own counting
    with device_scope():
        step = scenario(path, phases, marks)
        sync()
        setup = time.perf_counter() - started
        if os.environ.get("KC_GC_FREEZE") == "1":  # as vLLM's EngineCore does once started (freeze_gc_heap)
            import gc

            gc.collect()
            gc.freeze()
        if pin is not None:  # the timed part on the one CPU every timed process gets
            os.sched_setaffinity(0, {pin})
        if wait:
            print("READY", flush=True)
            if sys.stdin.readline().strip() != "GO":
                sys.exit(3)
        profiler = _profiler() if profile else None
        sync()
        usage = Usage()
        watch.on, phases.clock = True, time.perf_counter()
        if profiler:
            profiler.enable()
        tokens = step()
        mark = time.perf_counter()
        sync()
        end = time.perf_counter()
        usage = usage.since()
        if profiler:
            profiler.disable()
        watch.on, phases.stop = False, end
        first, final_sync = end - phases.clock, end - mark
        mark = time.perf_counter()
        step()
        sync()
        second = time.perf_counter() - mark
    return {"first_call": first, "first_call_usage": usage, "second_call": second, "final_sync": final_sync,
            "setup": setup,
            "marks": [[m, round(t - phases.clock, 6)] for m, t in marks], **watch.result(), **phases.summary(),
            "tokens": None if FAKE else _digest(tokens), "pinned_cpu": pin,
            "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "(unset: torch sets LAZY)"),
            "top": _top(profiler) if profiler else None}


def _digest(tokens) -> str:
    import hashlib

    return hashlib.sha256(tokens.cpu().numpy().tobytes()).hexdigest()[:16]


def _fake_target():
    """The dry run's set-up, as kernelcache's exercise worker makes it: vLLM's CUDA platform for an H100 (132 SMs)
    and Triton's fake sm_90 driver, whose launches do nothing. Its synchronize does nothing either."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["KERNELCACHE_TARGET_MODE"] = "cross"
    from kernelcache.exercise import fake_target, vllm_sampler

    fake_target.activate(90, 132, prebuild=False, stub_dir=tempfile.mkdtemp())
    vllm_sampler.setup_platform(90, 132, "NVIDIA H100 80GB HBM3")
    return lambda: None


def device_scope():
    """Fake CUDA tensors in a dry run (the exercise drivers' scope in cross mode); nothing otherwise."""
    import contextlib

    if not FAKE:
        return contextlib.nullcontext()
    from kernelcache.exercise import drivers

    return drivers.device_scope()


def _profiler():
    import cProfile

    return cProfile.Profile()


def _top(profiler, count: int = 45) -> list[dict]:
    """The functions with the most cumulative time, then those with the most time of their own."""
    import io
    import pstats

    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = [{"function": f"{Path(file).name}:{line}:{name}", "calls": nc, "tottime": round(tt, 5),
             "cumtime": round(ct, 5)} for (file, line, name), (_, nc, tt, ct, _) in stats.stats.items()]
    return sorted(rows, key=lambda r: -r["cumtime"])[:count] + sorted(rows, key=lambda r: -r["tottime"])[:25]


def gpu_work(avoid: int | None = None) -> None:
    """A matmul loop on command: reads ``WORK seconds`` lines, answers ``DONE`` once the GPU is idle again. Off the
    CPU ``avoid`` (the timed processes'), where there are others."""
    others = os.sched_getaffinity(0) - {avoid}
    if avoid is not None and others:
        os.sched_setaffinity(0, others)
    import torch

    a = torch.randn((8192, 8192), device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    print("READY", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] != "WORK":
            break
        until = time.perf_counter() + float(parts[1])
        while time.perf_counter() < until:
            for _ in range(20):
                a = (a @ b) * 1e-4
            torch.cuda.synchronize()
        print("DONE", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", choices=PATHS, help="the sampler path whose first call is timed")
    parser.add_argument("--profile", action="store_true", help="the first call under cProfile")
    parser.add_argument("--wait", action="store_true", help="say READY, wait for GO on stdin")
    parser.add_argument("--pin", type=int, help="the CPU the timed part runs on (--gpu-work: the CPU it avoids)")
    parser.add_argument("--fake", action="store_true", help="a CPU dry run: fake sm_90 target")
    parser.add_argument("--gpu-work", action="store_true", help="the matmul loop process")
    args = parser.parse_args()
    global FAKE
    FAKE = args.fake
    if args.gpu_work:
        gpu_work(args.pin)
        return 0
    if not args.path:
        parser.error("name a path or --gpu-work")
    print("RESULT " + json.dumps(child(args.path, args.profile, args.wait, args.pin), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
