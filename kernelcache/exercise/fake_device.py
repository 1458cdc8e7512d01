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

Layouts must be the GPU's own, since Triton specializes on every integer argument (``== 1``,
``% 16 == 0``) and on pointer alignment: a stride that differs from eager torch's is a different
cache key. FakeTensor computes layouts with torch's Python meta functions, and those differ from the
C++ kernels eager CUDA runs wherever a dim has size 1: eager ``empty_like`` (and every op that
allocates through it: ``*_like``, ``sort``, ...) keeps the input's strides when it is non-overlapping
and dense, size-1 dims included, and TensorIterator's fast path does the same for elementwise ops;
the meta functions recompute contiguous strides. So a ``[1, V]`` slice of a ``[1, V_padded]`` row,
copied to fp32, has stride ``(V_padded, 1)`` on the GPU and ``(V, 1)`` under plain FakeTensor.
``EagerLayout`` replays every op that allocates its outputs on real CPU tensors of the same layout
(eager ATen's layout rules are the same code for CPU and CUDA) and gives the fake outputs the strides
eager produced. Replays are cached by layout, so each distinct call runs once per process.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

aten = torch.ops.aten


def _on_cuda(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _is_fake(value: Any) -> bool:
    return isinstance(value, FakeTensor)


HOST_VALUES = "_kernelcache_host_values"  # the attribute of a fake holding its values (``FakeCuda``)
SMALL = 4096  # elements: the largest tensor whose values a fake keeps
READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__int__, torch.Tensor.__index__,
         torch.Tensor.__bool__, torch.Tensor.__float__}


class FakeCuda(TorchFunctionMode):
    """Routes Python indexing and host->device copies of fake CUDA tensors through aten ops.

    A small tensor made on ``cuda`` from Python data (``torch.tensor([0, T], device="cuda")``) keeps its values
    on the host, and so does every result computed from such tensors alone (slices, differences, ``cdiv``), so
    that code reading them back (``.tolist()``, ``.item()``: FLA's ``prepare_chunk_indices``) gets what the GPU
    would give. Any other fake has no values, and reading one fails as before."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS and _values(args[0]) is not None:
            with _disable_current_modes():  # the values are real host tensors
                return func(_values(args[0]), *args[1:])
        _forget_written(func, args, kwargs)
        out = self._route(func, args, dict(kwargs))
        _keep_values(func, args, kwargs, out)
        return out

    def _route(self, func, args, kwargs):
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
            out = torch.empty(host.shape, dtype=host.dtype, device=device)
            if host.numel() <= SMALL and not isinstance(args[0], torch.Tensor):
                with _disable_current_modes():  # real host values, whatever modes are active
                    setattr(out, HOST_VALUES, func(*args, **kwargs))
            return out
        return func(*args, **kwargs)


def _values(value: Any) -> torch.Tensor | None:
    return getattr(value, HOST_VALUES, None) if _is_fake(value) else None


def _forget_written(func, args, kwargs) -> None:
    """A fake written in place (``t.add_(1)``, ``t[i] = v``, ``out=t``) drops its host values, which would be
    stale: reading it then fails as for any fake. (A write through another view of its storage, or by a kernel,
    is not seen; the values kept are of small index tensors made from Python data, which nothing writes.)"""
    name = getattr(func, "__name__", "")
    written = [kwargs.get("out")]
    if name == "__setitem__" or name.startswith("__i") or (name.endswith("_") and not name.endswith("__")):
        written.append(args[0] if args else None)
    for tensor in written:
        if _values(tensor) is not None:
            delattr(tensor, HOST_VALUES)


def _keep_values(func, args, kwargs, out) -> None:
    """Give ``out`` the host values of ``func`` over the arguments' host values, when every fake argument has
    some (a call that fails on the host, or a large result, leaves ``out`` without)."""
    from torch.utils._pytree import tree_leaves, tree_map

    outs = list(out) if isinstance(out, (tuple, list)) else [out]  # unbind (iteration, FakeTensor.tolist), split
    if not outs or not all(_is_fake(o) and _values(o) is None for o in outs):
        return
    fakes = [leaf for leaf in tree_leaves((args, kwargs)) if _is_fake(leaf)]
    if not fakes or any(_values(f) is None for f in fakes):
        return
    host_args, host_kwargs = tree_map(lambda x: _values(x) if _is_fake(x) else x, (args, kwargs))
    if "device" in host_kwargs:
        host_kwargs["device"] = "cpu"
    try:
        with _disable_current_modes():
            host = func(*host_args, **host_kwargs)
    except Exception:  # noqa: BLE001 -- a host replay that cannot run leaves the fake as it was: without values
        return
    hosts = list(host) if isinstance(host, (tuple, list)) else [host]
    if len(hosts) == len(outs) and all(isinstance(h, torch.Tensor) and h.shape == o.shape and h.numel() <= SMALL
                                       for h, o in zip(hosts, outs)):
        for h, o in zip(hosts, outs):
            setattr(o, HOST_VALUES, h)


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
            advanced.append((dim, _positions(part if isinstance(part, torch.Tensor) else torch.tensor(part))))
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


def _positions(index: torch.Tensor) -> torch.Tensor:
    """A one-dimensional boolean index held on the host (its values are known) as the positions it selects, as
    eager indexing turns it into ``nonzero()``; FakeTensor cannot index with a mask, whose result size it cannot
    know. Other indices are returned as they are."""
    if index.dtype == torch.bool and index.dim() == 1 and not _is_fake(index) and index.device.type == "cpu":
        return index.nonzero().squeeze(1)
    return index


def _device_mask(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool and _is_fake(p) for p in parts)


def _put_masked(tensor: torch.Tensor, index: Any, value: Any) -> None:
    """``tensor[mask, ...] = value`` with a mask on the device (vLLM's GDN layer zeroes the initial states of fresh
    prefills so): in place, as ``index_put_``, the tensor keeps its layout (there are no values to write)."""
    parts = _expand(tensor, index)
    if not isinstance(parts[0], torch.Tensor) or any(p != slice(None) for p in parts[1:]):
        raise NotImplementedError(f"kernelcache fake CUDA: a device mask must lead the index, got {index!r}")
    fill = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=tensor.dtype)
    aten.index_put_.default(tensor, [parts[0]], fill)


def setitem(tensor: torch.Tensor, index: Any, value: Any) -> None:
    if _device_mask(index):
        return _put_masked(tensor, index, value)
    target = getitem(tensor, index)
    if isinstance(value, torch.Tensor):
        aten.copy_.default(target, value.expand_as(target) if value.dim() else value)
    else:
        aten.fill_.Scalar(target, value)


def _layout(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_layout(v) for v in value)
    if isinstance(value, torch.device):
        return "device"
    return repr(value)


def _real(value: Any) -> Any:
    """A CPU tensor with the fake's size, strides, offset and dtype (values: zeros for integers, else any)."""
    if isinstance(value, torch.Tensor):
        extent = value.storage_offset() + sum((s - 1) * st for s, st in zip(value.shape, value.stride()) if s > 0) + 1
        make = torch.empty if value.dtype.is_floating_point or value.dtype.is_complex else torch.zeros
        base = make(extent if value.numel() else 0, dtype=value.dtype)
        return base.as_strided(value.shape, value.stride(), value.storage_offset()) if value.numel() else \
            torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_real(v) for v in value)
    if isinstance(value, torch.device):
        return torch.device("cpu")
    return value


def _strides(out: Any) -> list:
    tensors = out if isinstance(out, (tuple, list)) else (out,)
    return [tuple(t.stride()) if isinstance(t, torch.Tensor) else None for t in tensors]


class EagerLayout(TorchDispatchMode):
    """Gives the outputs of fake ops the strides eager torch gives them (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not _allocates(func, args):
            return out
        eager = self._eager_strides(func, args, kwargs)
        if eager is None or len(eager) != len(_strides(out)):
            return out
        return self._restride(out, eager)

    def _eager_strides(self, func, args, kwargs) -> list | None:
        key = (func, _layout(args), _layout(tuple(sorted(kwargs.items()))))
        if key not in self.cache:
            self.cache[key] = _replay(func, args, kwargs)
        return self.cache[key]

    def _restride(self, out: Any, eager: list) -> Any:
        tensors = list(out) if isinstance(out, (tuple, list)) else [out]
        for i, (tensor, strides) in enumerate(zip(tensors, eager)):
            if isinstance(tensor, torch.Tensor) and strides is not None and tuple(tensor.stride()) != strides:
                tensors[i] = aten.empty_strided.default(tensor.shape, strides, dtype=tensor.dtype,
                                                        device=tensor.device)
        return type(out)(tensors) if isinstance(out, (tuple, list)) else tensors[0]


def _allocates(func, args) -> bool:
    """A functional op with a tensor input: its outputs are fresh allocations whose layout it chooses."""
    schema = func._schema
    if func.is_view or schema.is_mutable or not any(_has_tensor(a) for a in args):
        return False
    return all(not r.alias_info for r in schema.returns)


def _has_tensor(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    return isinstance(value, torch.Tensor)


def _replay(func, args, kwargs) -> list | None:
    """The output strides of ``func`` run eagerly on CPU tensors of the same layouts, or None if it cannot run."""
    kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
    try:
        with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
            return _strides(func(*_real(args), **_real(kwargs)))
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError):
        return None


@contextlib.contextmanager
def fake_cuda():
    """Inside: ``torch.empty(..., device="cuda")`` and friends make fake CUDA tensors with eager layouts."""
    with FakeTensorMode(allow_non_fake_inputs=True), EagerLayout() as layout, FakeCuda():
        yield layout
