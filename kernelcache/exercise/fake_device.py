"""CUDA tensors on a machine without CUDA: torch FakeTensors whose device is ``cuda:0``.

vLLM's sampler takes its CUDA branches from ``tensor.device.type`` (block sizes, ``num_warps``, the
split top-p pipeline), so the build must hand it tensors that *are* on ``cuda``. A FakeTensor has
the real shape, dtype, strides and storage offset (its ``data_ptr()`` is the offset in bytes, so
Triton sees the same 16-byte alignment class as on the GPU) and no data; kernels never run.

A CPU-only torch build cannot index such tensors from Python (``t[i]`` needs the CUDA device
guard), nor copy host data to them. ``FakeCuda`` translates those few entry points into the aten
ops that FakeTensor does support, and turns host-to-device copies into empty device tensors of the
same shape and dtype: values never matter here, only what Triton specializes on. Random draws
on fakes drop their ``generator`` (CPU torch has no CUDA generator; the draw has no values).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten


def _on_cuda(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _is_fake(value: Any) -> bool:
    return isinstance(value, FakeTensor)


class FakeCuda(TorchFunctionMode):
    """Routes Python indexing and host->device copies of fake CUDA tensors through aten ops."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__ and _is_fake(args[0]):
            return getitem(args[0], args[1])
        if func is torch.Tensor.__setitem__ and _is_fake(args[0]):
            return setitem(args[0], args[1], args[2])
        if func is torch.Tensor.copy_ and _is_fake(args[0]):
            return aten.copy_.default(args[0], args[1])
        if func is torch.Tensor.contiguous and _is_fake(args[0]):
            return args[0] if args[0].is_contiguous() else aten.clone.default(
                args[0], memory_format=torch.contiguous_format)
        if "generator" in kwargs and any(_is_fake(a) for a in args):
            kwargs.pop("generator")  # a fake has no values to draw; the draw never reaches a Triton key
        if func is torch.Tensor.new_tensor:
            return _empty_like_data(args[1], kwargs.get("dtype") or args[0].dtype,
                                    kwargs.get("device") or args[0].device)
        if func in (torch.tensor, torch.as_tensor) and _on_cuda(kwargs.get("device")):
            device = kwargs.pop("device")
            host = func(*args, **kwargs)
            return torch.empty(host.shape, dtype=host.dtype, device=device)
        return func(*args, **kwargs)


def _empty_like_data(data: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
    shape = data.shape if isinstance(data, torch.Tensor) else torch.tensor(data, device="cpu").shape
    return torch.empty(shape, dtype=dtype, device=device)


def _expand(tensor: torch.Tensor, index: Any) -> list:
    """The index as one entry per dimension (None entries add one): Ellipsis made explicit."""
    parts = list(index) if isinstance(index, tuple) else [index]
    consumed = sum(1 for p in parts if p is not None and p is not Ellipsis)
    fill = [slice(None)] * (tensor.dim() - consumed)
    at = next((i for i, p in enumerate(parts) if p is Ellipsis), None)
    if at is None:
        return parts + fill
    return parts[:at] + fill + parts[at + 1:]


def getitem(tensor: torch.Tensor, index: Any) -> torch.Tensor:
    """Basic and advanced indexing, as ``tensor[index]`` would do it on the GPU."""
    out, dim, advanced = tensor, 0, []
    for part in _expand(tensor, index):
        if part is None:
            out = aten.unsqueeze.default(out, dim)
            dim += 1
        elif isinstance(part, bool) or not isinstance(part, (int, slice)):
            advanced.append((dim, part if isinstance(part, torch.Tensor) else torch.tensor(part)))
            dim += 1
        elif isinstance(part, int):
            out = aten.select.int(out, dim, part)
        else:
            stop = part.stop if part.stop is not None else 2**62
            out = aten.slice.Tensor(out, dim, part.start or 0, stop, part.step or 1)
            dim += 1
    if advanced:
        indices: list = [None] * out.dim()
        for d, idx in advanced:
            indices[d] = idx
        out = aten.index.Tensor(out, indices)
    return out


def setitem(tensor: torch.Tensor, index: Any, value: Any) -> None:
    target = getitem(tensor, index)
    if isinstance(value, torch.Tensor):
        aten.copy_.default(target, value.expand_as(target) if value.dim() else value)
    else:
        aten.fill_.Scalar(target, value)


@contextlib.contextmanager
def fake_cuda():
    """Inside: ``torch.empty(..., device="cuda")`` and friends make fake CUDA tensors."""
    with FakeTensorMode(allow_non_fake_inputs=True), FakeCuda():
        yield
