"""What the independent probes share: vLLM's code under kernelcache's fake target, with every compile recorded.

Only kernelcache's fake driver is used (``fake_target.activate``, "the same fake target" as the build); the
CUDA platform vLLM sees is the probes' own minimal one, not the exercise code's. ``start`` must run before
the probe imports torch or vLLM's sampler modules; ``report`` prints one JSON line per compile() call:
{"name", "key", "hit"}. The probes of layers with autotuned kernels and host-side metadata (mamba, gdn) share
``every_candidate``, ``host_stays_real`` and ``one_rank``.
"""

import base64
import json
import os


def start(capability: int, sm_count: int) -> list[dict]:
    """Set the environment, attach the compile listener, activate the fake target and a CUDA platform with
    ``sm_count`` SMs; returns the list every compile() is appended to."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    os.environ["TQDM_DISABLE"] = "1"
    import triton

    events = []

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        key = base64.b32encode(bytes.fromhex(metadata["hash"])).decode().rstrip("=")
        events.append({"name": src.name, "key": key, "hit": cache_hit})

    triton.knobs.compilation.listener = listener
    from kernelcache.exercise import fake_target

    fake_target.activate(capability, sm_count, prebuild=False)

    import vllm.platforms
    from vllm.platforms.interface import Platform, PlatformEnum

    class ProbeCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"

        @classmethod
        def num_compute_units(cls, device_id=0):
            return sm_count

    vllm.platforms._current_platform = ProbeCuda()
    return events


def report(events: list[dict]) -> None:
    for event in events:
        print(json.dumps(event))


# -- what the probes of families with autotuned kernels and host-side metadata share --------------------------------


def every_candidate() -> list[tuple[str, str]]:
    """Triton's autotuner benchmarks again at every launch (its cache dropped first), with a benchmark that calls each
    candidate once (so each compiles) and ranks them equal; returns the list every benchmarked (kernel name, config
    label) is appended to, the label the config's meta-parameters, ``num_warps`` and ``num_stages`` as JSON."""
    import triton
    from triton.runtime.autotuner import Autotuner

    def equal_bench(kernel_call, quantiles=None):
        kernel_call()
        return [0.5, 0.5, 0.5]

    triton.runtime.driver.active.get_benchmarker = lambda: equal_bench
    run, bench, seen = Autotuner.run, Autotuner._bench, []

    def run_fresh(self, *args, **kwargs):
        self.cache.clear()
        return run(self, *args, **kwargs)

    def bench_seen(self, *args, config, **meta):
        label = json.dumps({**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages},
                           sort_keys=True)
        seen.append((self.base_fn.__name__, label))
        return bench(self, *args, config=config, **meta)

    Autotuner.run, Autotuner._bench = run_fresh, bench_seen
    return seen


def host_stays_real():
    """Modes under which ops on host tensors alone run for real (a metadata builder's CPU arithmetic) and pinning
    host memory is skipped (it needs a driver); enter both."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
    from torch.utils._pytree import tree_leaves

    class HostStaysReal(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.ops.aten._pin_memory.default:
                return args[0]
            if func is torch.ops.aten.is_pinned.default:
                return True
            kwargs.pop("pin_memory", None)
            leaves = tree_leaves((args, kwargs))
            on_device = any(isinstance(x, FakeTensor) or (isinstance(x, torch.Tensor) and x.is_cuda) for x in leaves)
            named = kwargs.get("device")
            if not on_device and (named is None or torch.device(named).type == "cpu"):
                with _disable_current_modes():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)

    class NoPinning(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.pin_memory:
                return args[0]
            kwargs.pop("pin_memory", None)
            return func(*args, **kwargs)

    return HostStaysReal(), NoPinning()


def one_rank() -> None:
    """vLLM's world and tensor-parallel group for one process (gloo)."""
    import socket

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        initialize_model_parallel(1)
