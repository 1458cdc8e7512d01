"""Cross-mode stand-ins for the CUDA runtime calls Model Runner V2's buffers make on the way to its kernels.

Model Runner V2 (vllm/v1/worker/gpu/) keeps per-request state in host arrays mirrored to the GPU
(vllm/v1/worker/gpu/buffer_utils.py): ``UvaBuffer`` pins a CPU tensor and hands kernels its device view
from ``torch.ops._C.get_cuda_view_from_cpu_tensor`` (vllm/utils/torch_utils.py
``get_accelerator_view_from_cpu_tensor``), and ``async_tensor_h2d`` stages host data in pinned memory.
Without a GPU (and without vLLM's C extension) none of that exists, so inside ``runner_ops()``:

* host tensors stay real CPU tensors (the runner reads them back through ``.numpy()``), while
  ``FakeTensorMode`` would otherwise make every factory call fake; ``pin_memory`` is dropped
  (pinning changes no shape, dtype or stride, and no kernel reads host memory);
* ``get_accelerator_view_from_cpu_tensor`` returns a fake CUDA tensor with the CPU tensor's shape,
  strides, dtype and a zero storage offset: the op's own contract (a device view of the same
  storage; pinned host allocations are page aligned, so the 16-byte alignment class is the same);
* ``is_uva_available`` is true, so the runner takes its UVA path (``UvaBuffer``, UVA write contents),
  the path a CUDA GPU takes; the ``NonUvaBuffer`` fallback is not used;
* ``torch.cuda.Stream`` / ``stream`` / ``current_stream`` are inert (the structured-output worker,
  vllm/v1/worker/gpu/structured_outputs.py, copies on a side stream; streams never reach a kernel key).

Native mode (a real GPU) keeps everything real; where vLLM's C extension is not installed (the GPU proof's
stripped tree), ``get_accelerator_view_from_cpu_tensor`` is served by ``uva_view``: the same device view
of the pinned host memory, made through ``__cuda_array_interface__`` (under UVA a pinned host pointer is
a valid device pointer, which is what the C op returns).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

FACTORIES = {torch.zeros, torch.empty, torch.ones, torch.full, torch.arange, torch.tensor, torch.as_tensor,
             torch.empty_strided, torch.zeros_like, torch.empty_like, torch.from_numpy}
SUBSTITUTIONS = ["get_cuda_view_from_cpu_tensor", "is_uva_available", "pin_memory", "torch.cuda.Stream",
                 "torch.cuda.stream", "torch.cuda.current_stream"]


def _host(kwargs: dict, args: tuple) -> bool:
    """A factory call that makes a CPU tensor (explicit ``device="cpu"`` or no device and no tensor input)."""
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device).type == "cpu"
    return not any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args)


class HostTensors(TorchFunctionMode):
    """Real CPU tensors for host-side factory calls inside ``FakeTensorMode``; ``pin_memory`` dropped."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        kwargs.pop("pin_memory", None)
        if func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.is_pinned:
            return True
        if func in FACTORIES and _host(kwargs, args):
            with torch.utils._python_dispatch._disable_current_modes():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def device_view(cpu_tensor: torch.Tensor) -> torch.Tensor:
    """``torch.ops._C.get_cuda_view_from_cpu_tensor``: a CUDA tensor of the same shape, strides and dtype."""
    return torch.empty_strided(tuple(cpu_tensor.shape), tuple(cpu_tensor.stride()), dtype=cpu_tensor.dtype,
                               device="cuda")


class InertStream:
    """What the runner asks of a CUDA stream: ``wait_stream``, ``record_event``, ``synchronize``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        pass


def uva_view(cpu_tensor: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor over a pinned CPU tensor's memory (what ``get_cuda_view_from_cpu_tensor`` returns)."""

    class _View:
        __cuda_array_interface__ = {
            "shape": tuple(cpu_tensor.shape), "typestr": cpu_tensor.numpy().__array_interface__["typestr"],
            "data": (cpu_tensor.data_ptr(), False), "version": 3,
            "strides": tuple(s * cpu_tensor.element_size() for s in cpu_tensor.stride())}

    return torch.as_tensor(_View(), device="cuda")


def _has_c_view_op() -> bool:
    try:
        return hasattr(torch.ops._C, "get_cuda_view_from_cpu_tensor")
    except (AttributeError, RuntimeError):
        return False


@contextlib.contextmanager
def _native_ops() -> Iterator[list[str]]:
    from vllm.v1.worker.gpu import buffer_utils

    if _has_c_view_op():
        yield []
        return
    saved = buffer_utils.get_accelerator_view_from_cpu_tensor
    buffer_utils.get_accelerator_view_from_cpu_tensor = uva_view
    try:
        yield ["get_cuda_view_from_cpu_tensor (uva_view)"]
    finally:
        buffer_utils.get_accelerator_view_from_cpu_tensor = saved


@contextlib.contextmanager
def runner_ops(cross: bool) -> Iterator[list[str]]:
    """Inside: the substitutions above, listed in what it yields (native mode: at most ``uva_view``)."""
    if not cross:
        with _native_ops() as substituted:
            yield substituted
        return
    from vllm.v1.worker.gpu import buffer_utils

    saved = {"view": buffer_utils.get_accelerator_view_from_cpu_tensor, "uva": buffer_utils.is_uva_available,
             "Stream": torch.cuda.Stream, "stream": torch.cuda.stream, "current": torch.cuda.current_stream}
    buffer_utils.get_accelerator_view_from_cpu_tensor = device_view
    buffer_utils.is_uva_available = lambda: True
    torch.cuda.Stream = InertStream  # type: ignore[misc,assignment]
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()  # type: ignore[assignment]
    torch.cuda.current_stream = lambda device=None: InertStream()  # type: ignore[assignment]
    try:
        with HostTensors():
            yield list(SUBSTITUTIONS)
    finally:
        buffer_utils.get_accelerator_view_from_cpu_tensor = saved["view"]
        buffer_utils.is_uva_available = saved["uva"]
        torch.cuda.Stream, torch.cuda.stream = saved["Stream"], saved["stream"]
        torch.cuda.current_stream = saved["current"]
