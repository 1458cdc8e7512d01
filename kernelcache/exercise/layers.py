"""What the stateful-layer drivers (exercise/vllm_mamba.py, exercise/vllm_gdn.py) and their GPU checks share.
Public: a new layer family's driver, and tests/gpu_checks/, import these from here, not from a sibling driver.

* A one-process world for vLLM's layers (``single_rank``) and rank 0 of a tensor-parallel size without a process
  group (``tensor_parallel``).
* Cross mode: host tensors that stay real inside the fake CUDA scope (``real_host``), a custom op resolved to its
  Python body (``python_bodies``), the platform's PDL answer (``pdl_like_cuda``) and the C op
  ``cutlass_scaled_mm_supports_fp8`` where vLLM's compiled ops are absent (``install_ops``).
* A profile run's swallowed warmup failure raised (``warmup_failures``).
* The step loop (``drive``), seeded hidden states (``random_hidden``) and what a task reports (``summary``).
* ``AutotuneCandidates``: in cross mode every launch of an autotuned kernel compiles every candidate that Triton's
  own ``Autotuner.prune_configs`` keeps, with a compile-only benchmark and no autotune JSON written; the GPU still
  times them at first launch unless ``kernelcache tune`` put its choices in the bundle.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import Counter
from typing import Any

from .drivers import cross


def drive(layer: Any, entries: list[str], batches: Any, forward_step: Any, profile_step: Any) -> dict:
    """Each entry's ``batches(entry)`` through the layer, the profile run's by ``profile_step``, every other by
    ``forward_step``, each on fresh random hidden states; the calls per entry."""
    calls: Counter = Counter()
    for entry in entries:
        for batch in batches(entry):
            (profile_step if entry == "profile" else forward_step)(layer, batch, random_hidden(layer, batch))
            calls[entry] += 1
    return dict(calls)


def summary(described: dict, entries: list[str], calls: dict, substitutions: dict, tuner: Any,
            started: float) -> dict:
    """What an autotuned family's task reports: the layer, what ran, what was substituted, what was tuned."""
    return {**described, "entries": entries, "calls": calls, "substitutions": substitutions,
            "autotune": tuner.summary() if tuner else "native: Triton's autotuner benchmarked on the device",
            "seconds": round(time.perf_counter() - started, 2)}


def cutlass_scaled_mm_supports_fp8(cuda_device_capability: int) -> bool:
    """csrc/libtorch_stable/quantization/w8a8/cutlass/scaled_mm_entry.cu: SM89+ with CUDA >= 12.0 (12.4 for SM89);
    torch 2.11's CUDA 13.0 build satisfies both."""
    return cuda_device_capability >= 89


def install_ops(fake_ops: Any) -> list[dict]:
    """The C ops the Mamba-2 path meets beyond exercise/fake_ops.py's: registered only where absent."""
    spec = fake_ops.OpSpec("_C", "cutlass_scaled_mm_supports_fp8",
                           "cutlass_scaled_mm_supports_fp8(int cuda_device_capability) -> bool",
                           "csrc/torch_bindings.cpp; called at import by quantization/online/fp8.py "
                           "Fp8PerTensorOnlineLinearMethod (w8a8_utils.cutlass_fp8_supported, "
                           "_custom_ops.cutlass_scaled_mm_supports_fp8), reached from ColumnParallelLinear.__init__",
                           cutlass_scaled_mm_supports_fp8)
    if fake_ops._present(spec):
        return []
    fake_ops._register(spec)
    return [{"op": spec.qualname, "upstream": spec.upstream, "fake": False, "torch": "cutlass_scaled_mm_supports_fp8"}]


def pdl_like_cuda() -> list[dict]:
    """Make the build's platform answer ``is_arch_support_pdl`` as ``CudaPlatform.is_arch_support_pdl`` does on the
    target."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    if platform.__name__ == "CudaPlatform" or "is_arch_support_pdl" in vars(platform):
        return []
    platform.is_arch_support_pdl = classmethod(lambda cls: cls.get_device_capability().major >= 9)
    return [{"platform": f"{platform.__name__}.is_arch_support_pdl",
             "as": "CudaPlatform.is_arch_support_pdl (major >= 9)",
             "why": "causal_conv1d passes it as launch_pdl, a Triton compile option"}]


@contextlib.contextmanager
def real_host():
    """Cross mode: host tensors stay real inside the fake CUDA scope, so the metadata builder's CPU arithmetic
    (``.item()``, ``.tolist()``, masks over ``query_start_loc_cpu``) computes values as on the server; pinning
    host memory (vLLM's ``PIN_MEMORY`` staging, utils/torch_utils.py) is a no-op, as it needs a driver."""
    if not cross():
        yield
        return
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class RealHost(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in PINNING:  # host memory is not pinned without a driver; no Triton key depends on it
                return PINNING[func](*args)
            if kwargs.get("pin_memory"):
                kwargs = {**kwargs, "pin_memory": False}
            if host_only(args, kwargs):
                from torch.utils._python_dispatch import _disable_current_modes

                with _disable_current_modes():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)

    import torch

    aten = torch.ops.aten
    PINNING = {aten._pin_memory.default: lambda tensor, *_: tensor, aten.is_pinned.default: lambda *_: True}
    class Unpinned(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.pin_memory:
                return args[0]
            if func is torch.Tensor.is_pinned:
                return True
            if kwargs.get("pin_memory"):
                kwargs = {**kwargs, "pin_memory": False}
            return func(*args, **kwargs)

    with RealHost(), Unpinned():
        yield


def host_only(args: Any, kwargs: dict) -> bool:
    """No fake tensor among the arguments and no device other than the CPU named."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, FakeTensor):
            return False
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu":
            return False
        if isinstance(leaf, (torch.device, str)) and leaf in ("cuda", torch.device("cuda")):
            return False
    device = kwargs.get("device")
    return device is None or torch.device(device).type == "cpu"


# -- tensor parallelism without a process group ---------------------------------------------------------------

# The modules that read the TP world size and rank on the Mamba-2 path: the mixer, the linear layers, vLLM's world.
TP_USERS = ("vllm.model_executor.layers.mamba.mamba_mixer2", "vllm.model_executor.layers.linear",
             "vllm.distributed", "vllm.distributed.parallel_state")


@contextlib.contextmanager
def tensor_parallel(size: int, users: tuple[str, ...] = TP_USERS):
    """A one-process world (gloo) when none exists; for TP > 1, rank 0 of ``size`` as the layers see it
    (their ``get_tensor_model_parallel_world_size`` / ``_rank``), without a group: the Mamba path on one rank
    runs no collective when ``n_groups % size == 0`` and the norm is not grouped across ranks."""
    import importlib

    single_rank()
    if size == 1:
        yield
        return
    saved = []
    for name in users:
        module = importlib.import_module(name)
        for attr, value in (("get_tensor_model_parallel_world_size", lambda: size),
                            ("get_tensor_model_parallel_rank", lambda: 0)):
            if hasattr(module, attr):
                saved.append((module, attr, getattr(module, attr)))
                setattr(module, attr, value)
    try:
        yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)


def single_rank() -> None:
    """vLLM's world and TP group for one process (gloo), as a one-GPU server has them."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        initialize_model_parallel(1)


# -- steps ----------------------------------------------------------------------------------------------------


def random_hidden(layer: Any, batch: Any) -> Any:
    """Hidden states for ``batch`` (``num_tokens`` rows of ``layer.dims``' hidden size and dtype), seeded by the
    token count on a GPU, so two processes feed a layer the same inputs."""
    import torch

    generator = None if cross() else torch.Generator(device="cuda").manual_seed(batch.num_tokens)
    dtype = getattr(torch, layer.dims.dtype)
    return torch.randn((batch.num_tokens, layer.dims.hidden_size), generator=generator, device="cuda").to(dtype)



@contextlib.contextmanager
def warmup_failures(module: str):
    """Raise what a layer's profile-run warmup caught: vLLM logs it as a warning (with the exception) and goes on,
    and a build would then silently lack the warmup's kernels."""
    import logging

    caught: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage().lower()
            if record.levelno >= logging.WARNING and "warmup" in message and "fail" in message:
                caught.append(record)

    logger, handler = logging.getLogger(module), Catch()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if caught:
        record = caught[0]
        raise RuntimeError(f"{module}: the profile run's warmup failed: {record.getMessage()}") from (
            record.exc_info[1] if record.exc_info else None)


@contextlib.contextmanager
def python_bodies(module: str, ops: tuple[str, ...]):
    """Cross mode: each ``torch.ops.vllm.<op>`` resolves to the Python body of the same name in ``module`` while
    inside (under a FakeTensor mode a custom op runs its fake implementation, which launches no kernel)."""
    if not cross():
        yield
        return
    import importlib

    import torch

    bodies = importlib.import_module(module)
    namespace = torch.ops.vllm
    saved = {op: namespace.__dict__.get(op) for op in ops}
    for op in ops:
        setattr(namespace, op, getattr(bodies, op))
    try:
        yield
    finally:
        for op, value in saved.items():
            if value is None:
                delattr(namespace, op)
            else:
                setattr(namespace, op, value)


# -- autotuned kernels ----------------------------------------------------------------------------------------


class _Rebench(dict):
    """An autotune cache that reports every key as new, so each launch benchmarks (here: compiles) again."""

    def __contains__(self, key: object) -> bool:
        return False


class _NeverStore(dict):
    """vLLM's ``_autotuned_configs`` that remembers nothing, so every launch goes through ``Autotuner.run``."""

    def __setitem__(self, key: object, value: object) -> None:
        return None


class AutotuneCandidates:
    """Cross mode: every launch of an autotuned kernel of ``modules`` compiles all candidates (module docstring).
    ``memos``: modules whose ``_autotuned_configs`` (vLLM's own memo of chosen configs, mamba/ops/triton_helpers.py)
    is replaced, while inside, by one that remembers nothing, so every launch goes through ``Autotuner.run``."""

    def __init__(self, modules: tuple[str, ...], memos: tuple[str, ...] = ()) -> None:
        self.modules, self.memos = modules, memos
        self.kernels: dict[str, Any] = {}
        self.candidates: dict[str, set] = {}
        self.keys: dict[str, set] = {}
        self.saved: list = []

    def __enter__(self) -> AutotuneCandidates:
        import importlib

        for name in self.memos:
            memo = importlib.import_module(name)
            self.saved.append((memo, "_autotuned_configs", memo._autotuned_configs))
            memo._autotuned_configs = _NeverStore()
        for name in self.modules:
            for kernel in autotuners(importlib.import_module(name)):
                if kernel.base_fn.__name__ not in self.kernels:
                    self._patch(kernel)
        return self

    def _patch(self, kernel: Any) -> None:
        name = kernel.base_fn.__name__
        self.kernels[name] = kernel
        self.candidates[name], self.keys[name] = set(), set()
        for attr in ("cache", "cache_results"):
            self.saved.append((kernel, attr, getattr(kernel, attr)))
        kernel.cache, kernel.cache_results = _Rebench(), False
        original = kernel._bench

        def bench(*args, config, **meta):
            self.candidates[name].add(config_label(config))
            self.keys[name].add(tuple(meta.get(k, kernel.nargs.get(k)) for k in kernel.keys))
            return original(*args, config=config, **meta)

        kernel._bench = bench
        kernel.__dict__["do_bench"] = compile_only_bench

    def __exit__(self, *exc: object) -> None:
        for owner, attr, value in reversed(self.saved):
            setattr(owner, attr, value)
        for kernel in self.kernels.values():
            kernel.__dict__.pop("do_bench", None)
            kernel.__dict__.pop("_bench", None)

    def summary(self) -> dict:
        """Per autotuned kernel: its configs, the candidates compiled (after pruning), its tuning keys."""
        return {name: {"configs": len(kernel.configs), "candidates": sorted(self.candidates[name]),
                       "tuning_keys": [list(map(str, key)) for key in sorted(self.keys[name], key=str)],
                       "key_args": list(kernel.keys), "pruned_by": pruning(kernel)}
                for name, kernel in sorted(self.kernels.items())}


def autotuners(module: Any) -> list[Any]:
    """The ``Autotuner`` objects of a module's kernels, under any ``@triton.heuristics`` wrapping them."""
    from triton.runtime.autotuner import Autotuner

    found = []
    for value in vars(module).values():
        for _ in range(3):
            if isinstance(value, Autotuner):
                found.append(value)
                break
            value = getattr(value, "fn", None)
    return found


def config_label(config: Any) -> str:
    """A candidate as JSON: its meta-parameters, ``num_warps`` and ``num_stages`` (what its compile key holds)."""
    import json

    return json.dumps({**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages},
                      sort_keys=True)


def pruning(kernel: Any) -> list[str]:
    """The autotuner's own pruning hooks (none on vLLM 0.33's SSD kernels; their config lists are fixed at
    import, ``_drop_racy_wgmma_configs`` on sm_90)."""
    hooks = [("early_config_prune", kernel.early_config_prune), ("perf_model", kernel.perf_model)]
    return [name for name, hook in hooks if hook is not None]


def compile_only_bench(kernel_call: Any, quantiles: Any = None) -> list[float]:
    """The fake target's benchmark: one call (compile, no-op launch) and the same made-up time for every config."""
    kernel_call()
    return [1.0, 1.0, 1.0]
