#!/usr/bin/env python3
"""The first sampler call of a user's fresh process, with a bundle served by kernelcache and with a plain warm cache.

What a user's process meets (issue 32), timed so that it cannot flatter the bundle:

* paths: ``k`` (vLLM's ``apply_top_k_top_p_triton`` alone, top-k and top-p), ``mrv1`` (three ``Sampler`` calls at
  B=16: top-k+top-p, top-k, top-p, each with 16 seeded CUDA generators made in the call) and ``mrv2`` (MRV2's seeded
  chain: temperature, min-p, top-k/top-p, Gumbel, in four modes: k+p, k, p, none); logits as the LM head returns
  them (fp32, rows padded to 64 columns);
* every process is a fresh one. Before the clock: ``import torch``, CUDA init, the imports, ``Sampler()``, the
  inputs. The clock runs from a ``torch.cuda.synchronize()`` to the one after the last call;
* modes: ``warm`` (a plain Triton cache that cold processes of the same paths left; ``TRITON_CACHE_DIR`` only),
  ``served`` (``python3 -m kernelcache run --cache-dir D -- ...`` on the installed bundle, after the first served
  process of that cache: what a second served process meets), ``served-fresh`` (the first served process after a
  fresh install: each one's own new cache dir, the bundle installed into it just before the process starts, as a
  pod's init container installs it; it replays the bundle's walk records), ``served-walk`` (``served`` with
  ``KERNELCACHE_REPLAY_WALKS=0``: Triton walks every kernel) and, when asked, ``served-eager``
  (``CUDA_MODULE_LOADING=EAGER``: torch's kernels loaded before the clock, which tells what CUDA's lazy loading
  costs the call);
* rounds interleave the modes per path (warm, served, served-walk in odd rounds, reversed in even ones, so that no
  mode always runs right after another), in two phases: ``quiet`` (the GPU idle before) and ``busy`` (a matmul loop
  right before each timed call, and 10 s of it before each batch). Before the rounds, the first served process of
  each path in the shared install (what it walks the bundle's records do not cover, and keeps at exit).

To fit one device call, the processes of a batch start together, each does everything before the clock, says
READY and waits on its stdin; the driver then lets one at a time run its timed part and exit (the others sleep in a
read), so no timed call shares the CPU or GPU, and each runs on the same CPU (``--pin``; the busy phase's matmul
loop on the others). Each process also times, without cProfile, where its first call
goes (``PHASES``: triton_key, each kernel's ``cache_key`` walk, compile()'s hit path, module loads, helper modules,
the driver's start, generator set-up, GC pauses), counts what the call used besides wall time (``Usage``: CPU time,
page faults, context switches; the same work gives the same faults and about the same CPU time where the wall time
of one process and the next differ), counts compiles with kernelcache's compile listener and the commands it
starts; one extra process per path and mode runs its first call under cProfile (``served`` ones with
``KERNELCACHE_DEBUG=1``). Everything is written as it comes: a failed process or mode loses nothing else.

    python3 scripts/gpu/first_call_rounds.py --bundles '.carry/fc/*.tar.zst' --out $OUT --rounds 3
    python3 scripts/gpu/first_call_rounds.py --modes warm,served,served-fresh --rounds 3    # what a pod meets
    python3 scripts/gpu/first_call_rounds.py --summarise $OUT/rows.jsonl      # the tables again, from the rows
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
BATCH, VOCAB, PADDING = 16, 50257, 64
PATHS = ("k", "mrv1", "mrv2")
MRV1_MODES = ("top_k_top_p", "top_k", "top_p")
MRV2_MODES = ("top_k_top_p", "top_k", "top_p", "none")


# == the harness (one fresh process) =================================================================


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
    """Fake CUDA tensors in a dry run (kernelcache/exercise/fake_device.py); nothing otherwise."""
    import contextlib

    if not FAKE:
        return contextlib.nullcontext()
    from kernelcache.exercise.fake_device import fake_cuda

    return fake_cuda()


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


# == the driver =======================================================================================


class Child:
    """One harness process of the driver: started now, told GO later; its stdout lines in a queue."""

    def __init__(self, spec: dict, command: list[str], env: dict, workdir: Path):
        self.spec = spec
        self.stderr_path = workdir / f"child-{spec['id']}.err"
        self.stderr = open(self.stderr_path, "w")  # noqa: SIM115 -- closed in finish()
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, text=True, cwd=str(REPO))
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, word: str, timeout: float) -> str | None:
        """The first line starting with ``word``, or None (the process ended or the time ran out)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(word):
                return line

    def go(self, timeout: float) -> dict:
        """Release the process; its row (result or error), once it has exited."""
        row = dict(self.spec)
        if self.spec.get("wait", True):
            try:
                self.process.stdin.write("GO\n")
                self.process.stdin.flush()
            except OSError:  # it ended already: what it printed says why
                pass
        line = self.wait_for("RESULT ", timeout)
        if line is None:
            return self.finish({**row, "error": "no result"})
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return self.finish({**row, **json.loads(line[len("RESULT "):])})

    def finish(self, row: dict) -> dict:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stderr.close()
        text = self.stderr_path.read_text(errors="replace")
        row["debug"] = [line for line in text.splitlines() if line.startswith("kernelcache[")]
        if row["debug"]:
            walks = [line.split(": ")[2].split(" ")[0] for line in row["debug"] if "Triton's walk of " in line]
            row["walks"] = {how: walks.count(how) for how in sorted(set(walks))}
        if "error" in row or self.process.returncode:
            row["returncode"] = self.process.returncode
            row["stderr_tail"] = text[-3000:]
        return row


class Driver:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="kc-rounds-"))
        self.deadline = time.monotonic() + args.budget
        self.rows: list[dict] = []
        self.served = self.work / "served"
        self.warm = self.work / "warm"
        self.pin = None if args.no_pin else args.pin if args.pin is not None else max(os.sched_getaffinity(0))
        self.bundle = ""  # the one installed (``install``): every served-fresh process gets a new install of it
        self.next_id = 0
        self.children: list[Child] = []  # started and not finished: ended if the driver is
        self.gpu: subprocess.Popen | None = None

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    # -- set-up --
    def install(self) -> str:
        """Install the first bundle the GPU check accepts; its path."""
        for bundle in sorted(glob.glob(self.args.bundles)):
            done = self.install_into(bundle, self.served)
            self.say(f"install {bundle}: exit {done.returncode} {(done.stdout + done.stderr).strip()[-400:]}")
            if done.returncode == 0:
                self.bundle = bundle
                return bundle
        raise SystemExit("no bundle installs on this GPU")

    def install_into(self, bundle: str, cache: Path) -> subprocess.CompletedProcess:
        check = ["--no-gpu-check"] if FAKE else []  # a dry run has no GPU to check the bundle against
        return subprocess.run([sys.executable, "-m", "kernelcache", "install", bundle, "--cache-dir", str(cache),
                               *check], capture_output=True, text=True, env=self.env(), cwd=str(REPO))

    def fresh_cache(self, spec: dict) -> Path:
        """A new cache dir with the bundle freshly installed, for one ``served-fresh`` process (off its clock: the
        process starts after the install, as a pod's server after its init container)."""
        cache = self.work / f"fresh-{spec['id']}"
        done = self.install_into(self.bundle, cache)
        if done.returncode:
            raise OSError(f"install into {cache}: exit {done.returncode} {(done.stdout + done.stderr)[-400:]}")
        return cache

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "KERNELCACHE_"))}
        return {**env, "VLLM_USE_FLASHINFER_SAMPLER": "0", **extra}

    def command(self, spec: dict) -> tuple[list[str], dict]:
        harness = [sys.executable, str(HERE), "--child", spec["path"]]
        if self.pin is not None:
            harness += ["--pin", str(self.pin)]
        if spec.get("profile"):
            harness.append("--profile")
        if spec.get("wait", True):
            harness.append("--wait")
        if FAKE:
            harness.append("--fake")
        mode = spec["mode"]
        if mode in ("warm", "cold"):
            return harness, self.env(TRITON_CACHE_DIR=str(self.warm))
        extra = {"KERNELCACHE_REPLAY_WALKS": "0"} if mode == "served-walk" else {}
        if mode == "served-eager":
            extra["CUDA_MODULE_LOADING"] = "EAGER"
        if spec.get("profile") or spec.get("debug"):
            extra["KERNELCACHE_DEBUG"] = "1"
        cache = self.fresh_cache(spec) if mode == "served-fresh" else self.served
        run = [sys.executable, "-m", "kernelcache", "run", "--cache-dir", str(cache), "--"]
        return run + harness, self.env(**extra)

    def spec(self, phase: str, rnd: int, path: str, mode: str, **more) -> dict:
        self.next_id += 1
        return {"id": self.next_id, "phase": phase, "round": rnd, "path": path, "mode": mode, **more}

    def cold(self) -> None:
        """Cold processes (one per path, side by side) fill the plain cache that ``warm`` processes then read."""
        paths = self.args.paths.split(",")
        children = [self.start(self.spec("setup", 0, path, "cold", wait=False)) for path in paths]
        for item in children:
            row = item.go(timeout=max(60.0, self.left())) if item else None
            if row:
                self.record(row)

    # -- batches --
    def start(self, spec: dict) -> Child | None:
        try:
            command, env = self.command(spec)
            self.children.append(Child(spec, command, env, self.work))
            return self.children[-1]
        except OSError as exc:
            self.record({**spec, "error": f"could not start: {exc}"})
            return None

    def batch(self, specs: list[dict], busy: bool) -> None:
        """Start ``specs`` together, wait until each is READY, then time them one at a time, in order."""
        if self.left() < 60:
            self.say(f"skipped a batch of {len(specs)}: {self.left():.0f} s left")
            return
        self.say(f"batch of {len(specs)} ({'busy' if busy else 'quiet'}): starting")
        children = [c for c in (self.start(s) for s in specs) if c]
        ready = []
        for item in children:
            if item.wait_for("READY", timeout=max(5.0, min(300.0, self.left() - 30))) is None:
                self.record(item.finish({**item.spec, "error": "never became ready"}))
            else:
                ready.append(item)
        self.say(f"batch ready: {len(ready)} of {len(children)}")
        if busy:
            self.gpu_work(self.args.busy_start)
        for item in ready:
            if self.left() < 15:
                self.record(item.finish({**item.spec, "error": "out of time before its turn"}))
                continue
            if busy:
                self.gpu_work(self.args.busy_each)
            self.record(item.go(timeout=min(120.0, self.left())))

    def gpu_work(self, seconds: float) -> None:
        if FAKE:  # no GPU to keep busy
            return
        if self.gpu is None:
            avoid = [] if self.pin is None else ["--pin", str(self.pin)]
            self.gpu = subprocess.Popen([sys.executable, str(HERE), "--gpu-work", *avoid], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=self.env(), cwd=str(REPO))
            self.gpu.stdout.readline()
        self.gpu.stdin.write(f"WORK {seconds}\n")
        self.gpu.stdin.flush()
        self.gpu.stdout.readline()

    def record(self, row: dict) -> None:
        row["wall_clock"] = time.strftime("%H:%M:%S")
        self.rows.append(row)
        with open(self.out / "rows.jsonl", "a") as handle:
            handle.write(json.dumps({k: v for k, v in row.items() if k != "top"}) + "\n")
        if row.get("top") or row.get("debug"):
            with open(self.out / "profiles.jsonl", "a") as handle:
                handle.write(json.dumps({k: row.get(k) for k in ("id", "phase", "round", "path", "mode", "profile",
                                                                 "first_call", "first_call_phases", "top", "debug")})
                             + "\n")
        what = f"{row['phase']} r{row['round']} {row['path']:4s} {row['mode']:12s}"
        if "error" in row:
            self.say(f"{what} ERROR {row['error']}")
        else:
            self.say(f"{what} first {row['first_call'] * 1000:7.1f} ms  second {row['second_call'] * 1000:6.2f} ms  "
                     f"compiles {row['compiles']} builds {len(row['builds'])}")
        write_summary(self.rows, self.out)

    def plan(self) -> list[tuple[list[dict], bool]]:
        """The batches: the first served process of each path (in the fresh install: it walks every kernel and keeps
        the walks at exit; the next paths' first ones replay the kernels they share), quiet rounds, the profiled
        processes after the first quiet batch (so a short run still has them), busy rounds, then one ``served-eager``
        process per path if time is left."""
        modes, rounds, paths = self.args.modes.split(","), self.args.rounds, self.args.paths.split(",")
        firsts = [self.spec("quiet", 0, p, "served", first_in_cache=True, debug=True) for p in paths]
        quiet = firsts + [self.spec("quiet", r, p, m) for r in range(1, rounds + 1) for p in paths
                          for m in round_order(modes, r)]
        busy = [self.spec("busy", r, p, m) for r in range(1, rounds + 1) for p in paths for m in round_order(modes, r)]
        profiles = [self.spec("profile", 0, p, m, profile=True) for p in paths for m in modes]
        size = self.args.batch
        batches = [(quiet[i:i + size], False) for i in range(0, len(quiet), size)]
        batches.insert(1, (profiles, False))
        batches += [(busy[i:i + size], True) for i in range(0, len(busy), size)]
        if "served-eager" not in modes and not self.args.no_eager:  # what CUDA's lazy loading costs, if time is left
            batches.append(([self.spec("diagnostic", 0, p, "served-eager", debug=True) for p in paths], False))
        return batches

    def run(self) -> int:
        import signal

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: the finally below still runs
        try:
            self.say(f"work dir {self.work}; installed {self.install()} into {self.served}")
            self.cold()
            for specs, busy in self.plan():
                self.batch(specs, busy)
        finally:
            for item in self.children:
                if item.process.poll() is None:
                    item.process.kill()
            if self.gpu is not None:
                self.gpu.kill()
            write_summary(self.rows, self.out)
            self.say(f"done: {len(self.rows)} processes, {sum('error' in r for r in self.rows)} failed")
        return 0


def round_order(modes: list[str], rnd: int) -> list[str]:
    """The modes in the order given in odd rounds and reversed in even ones, so that no mode always runs right after
    another (a process's speed follows what ran before it: served-fresh after served in every round made any such
    drift look like a difference between them)."""
    return list(modes) if rnd % 2 else list(reversed(modes))


# == the summary ======================================================================================

ROUNDED = ("first_call", "second_call")


def write_summary(rows: list[dict], out: Path) -> None:
    summary = summarise(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))


def summarise(rows: list[dict]) -> dict:
    """Per phase, path and mode: every first call (in round order), median, min, max; served vs warm per round."""
    timed = [r for r in rows if "first_call" in r and not r.get("profile") and r["mode"] != "cold"]
    groups: dict = {}
    for row in timed:
        label = "served (first in cache)" if row.get("first_in_cache") else row["mode"]
        groups.setdefault((row["phase"], row["path"], label), []).append(row)
    table = []
    for (phase, path, mode), group in sorted(groups.items()):
        values = [r["first_call"] for r in sorted(group, key=lambda r: r["round"])]
        table.append({"phase": phase, "path": path, "mode": mode, "n": len(values),
                      "first_calls_ms": [round(v * 1000, 1) for v in values],
                      "median_ms": round(statistics.median(values) * 1000, 1),
                      "min_ms": round(min(values) * 1000, 1), "max_ms": round(max(values) * 1000, 1),
                      "second_call_ms": round(statistics.median(r["second_call"] for r in group) * 1000, 2),
                      "compiles": sorted({r["compiles"] for r in group}),
                      "builds": sorted({b for r in group for b in r["builds"]}),
                      "triton_key_ms": [round(_seconds(r, "triton_key") * 1000, 1) for r in group],
                      "thread_cpu_ms": [_used(r, "thread_cpu_ms") for r in sorted(group, key=lambda r: r["round"])],
                      "minflt": [_used(r, "minflt") for r in sorted(group, key=lambda r: r["round"])],
                      "walks": sorted({json.dumps(r["walks"]) for r in group if r.get("walks")}),
                      "phases_ms": _median_phases(group)})
    return {"table": table, "ratios": ratios(timed), "failed": [
        {k: r.get(k) for k in ("id", "phase", "round", "path", "mode", "error", "stderr_tail")}
        for r in rows if "error" in r]}


def _used(row: dict, name: str):
    """One of the first call's ``Usage`` numbers (None in rows from before the harness kept them)."""
    return (row.get("first_call_usage") or {}).get(name)


def _seconds(row: dict, phase: str) -> float:
    return row.get("first_call_phases", {}).get(phase, {}).get("seconds", 0.0)


def _median_phases(group: list[dict]) -> dict:
    names = {name for r in group for name in r.get("first_call_phases", {}) if isinstance(r, dict)}
    found = {}
    for name in sorted(names):
        values = [_seconds(r, name) for r in group]
        found[name] = round(statistics.median(values) * 1000, 2)
    found["gc"] = round(statistics.median(r.get("gc_seconds", 0.0) for r in group) * 1000, 2)
    return found


def ratios(rows: list[dict]) -> list[dict]:
    """Each served mode's first call over the plain warm cache's of the same phase, path and round."""
    warm = {(r["phase"], r["path"], r["round"]): r["first_call"] for r in rows if r["mode"] == "warm"}
    found = {}
    for row in rows:
        base = warm.get((row["phase"], row["path"], row["round"]))
        if row["mode"].startswith("served") and base and not row.get("first_in_cache"):
            found.setdefault((row["phase"], row["path"], row["mode"]), []).append(round(row["first_call"] / base, 3))
    second = {(r["phase"], r["path"], r["round"]): r for r in rows
              if r["mode"] == "served" and not r.get("first_in_cache")}
    fresh, cpu = {}, {}
    for row in rows:
        other = second.get((row["phase"], row["path"], row["round"]))
        if row["mode"] != "served-fresh" or not other:
            continue
        fresh.setdefault((row["phase"], row["path"]), []).append(round(row["first_call"] / other["first_call"], 3))
        if _used(row, "thread_cpu_ms") and _used(other, "thread_cpu_ms"):
            cpu.setdefault((row["phase"], row["path"]), []).append(
                round(_used(row, "thread_cpu_ms") / _used(other, "thread_cpu_ms"), 3))
    return [{"phase": p, "path": path, "mode": m, "per_round": v, "max": max(v), "median": statistics.median(v),
             "every_round_at_most_0.25": max(v) <= 0.25, "every_round_at_most_0.2": max(v) <= 0.2,
             "vs_second_served_per_round": fresh.get((p, path)) if m == "served-fresh" else None,
             "cpu_vs_second_served_per_round": cpu.get((p, path)) if m == "served-fresh" else None}
            for (p, path, m), v in sorted(found.items())]


def markdown(summary: dict) -> str:
    lines = ["| phase | path | mode | first calls, ms (round order) | median [min-max] | vs warm, per round | "
             "vs served, per round | the call's CPU (its thread), ms | CPU vs served | second call | compiles | "
             "triton_key() in the call, ms | walks |",
             "|" + " --- |" * 13]
    by = {(r["phase"], r["path"], r["mode"]): r for r in summary["ratios"]}
    for row in summary["table"]:
        ratio = by.get((row["phase"], row["path"], row["mode"]))
        calls = ", ".join(map(str, row["first_calls_ms"]))
        lines.append(f"| {row['phase']} | {row['path']} | {row['mode']} | {calls} | "
                     f"{row['median_ms']} [{row['min_ms']}-{row['max_ms']}] | "
                     f"{', '.join(f'{v:.2f}×' for v in ratio['per_round']) if ratio else ''} | "
                     f"{', '.join(f'{v:.2f}×' for v in (ratio or {}).get('vs_second_served_per_round') or ())} | "
                     f"{', '.join(str(v) for v in row['thread_cpu_ms'] if v is not None)} | "
                     f"{', '.join(f'{v:.2f}×' for v in (ratio or {}).get('cpu_vs_second_served_per_round') or ())} | "
                     f"{row['second_call_ms']} ms | {row['compiles']} | {', '.join(map(str, row['triton_key_ms']))} | "
                     f"{'; '.join(row['walks'])} |")
    lines += ["", "Median time inside the first call, ms, by phase (inclusive; nested: compile > get_cache_key > "
              "triton_key, cache_key; init_handles > launcher_init, module_load):", ""]
    names = sorted({n for row in summary["table"] for n in row["phases_ms"]})
    lines.append("| phase | path | mode | " + " | ".join(names) + " |")
    lines.append("| --- | --- | --- | " + " | ".join("---" for _ in names) + " |")
    for row in summary["table"]:
        lines.append(f"| {row['phase']} | {row['path']} | {row['mode']} | "
                     + " | ".join(str(row["phases_ms"].get(n, "")) for n in names) + " |")
    if summary["failed"]:
        lines += ["", f"{len(summary['failed'])} process(es) failed: see summary.json"]
    return "\n".join(lines) + "\n"


# == command line =====================================================================================


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=PATHS, help="run one harness process for this path")
    parser.add_argument("--profile", action="store_true", help="(child) the first call under cProfile")
    parser.add_argument("--wait", action="store_true", help="(child) say READY, wait for GO on stdin")
    parser.add_argument("--pin", type=int, help="the CPU every timed part runs on (default: the highest the driver "
                                                "may use); the busy phase's matmul loop runs on the others")
    parser.add_argument("--no-pin", action="store_true", help="timed parts run on any CPU")
    parser.add_argument("--fake", action="store_true", help="(child, driver) a CPU dry run: fake sm_90 target")
    parser.add_argument("--gpu-work", action="store_true", help="the matmul loop process")
    parser.add_argument("--summarise", metavar="ROWS", help="rewrite summary.json/.md beside ROWS (rows.jsonl)")
    parser.add_argument("--bundles", default=".carry/fc/*.tar.zst", help="glob; the first the GPU check accepts")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--modes", default="warm,served,served-walk",
                        help="of warm, served, served-fresh, served-walk, served-eager (in the order each round "
                             "runs them)")
    parser.add_argument("--batch", type=int, default=15, help="processes started together")
    parser.add_argument("--no-eager", action="store_true", help="no closing served-eager batch")
    parser.add_argument("--busy-start", type=float, default=10.0, help="seconds of matmuls before a busy batch")
    parser.add_argument("--busy-each", type=float, default=1.5, help="seconds of matmuls before each busy call")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds from the start after which no process is started or released")
    args = parser.parse_args()
    global FAKE
    FAKE = args.fake
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.profile, args.wait, args.pin), default=str), flush=True)
        return 0
    if args.gpu_work:
        gpu_work(args.pin)
        return 0
    if args.summarise:
        rows = [json.loads(line) for line in Path(args.summarise).read_text().splitlines() if line.strip()]
        write_summary(rows, Path(args.summarise).parent)
        print((Path(args.summarise).parent / "summary.md").read_text())
        return 0
    return Driver(args).run()


if __name__ == "__main__":
    sys.exit(main())
