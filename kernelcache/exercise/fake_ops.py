"""Stand-ins for the vLLM C ops and imports that vLLM 0.33's fused-MoE path meets, where vLLM's compiled
extensions are absent (the CPU build box, and the GPU proof machine's pure-Python vLLM tree).

The Triton keys of the MoE path depend only on shapes, dtypes, strides and alignment, and the C ops around
the Triton GEMMs (routing, block alignment, activation, top-k reduction) write into buffers that vLLM's
Python code allocates itself (vllm/_custom_ops.py, vllm/model_executor/layers/fused_moe/*). So an op that
is registered under the same name and schema, with a fake (meta) implementation that does nothing but keep
the caller's buffers, leaves every key as it is; under a FakeTensor there are no values to compute anyway.
Each op also gets a plain-torch implementation (``CompositeExplicitAutograd``), for real tensors where the
op is missing (the GPU proof, tests/gpu_checks/moe.py). An op is registered only when the real one is
absent; ``install`` reports what it substituted, and the build records that in its task summary.

Schemas follow the calls in vllm/_custom_ops.py of the installed vLLM (0.33.0), with the op definitions of
vLLM's csrc/moe/torch_bindings.cpp (``_moe_C``) and csrc/torch_bindings.cpp (``_C``).

Import-time shims: ``vllm.vllm_flash_attn`` raises ImportError without its FA extensions, and
``vllm.v1.attention.backends.fa_utils`` imports it unconditionally on CUDA (reached from
fused_moe/utils.py through model_executor/models/utils.py); ``einops`` is imported at module level by
``vllm.v1.attention.ops.vit_attn_wrappers`` on the same chain. Neither is called on the MoE path:
they are replaced, only when the import fails, by modules whose functions raise when called.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

_LIBRARIES: list = []  # torch.library.Library objects must outlive the registrations
_SUBSTITUTED: dict[str, dict] = {}  # what this process registered: reported again by later calls


@dataclass(frozen=True)
class OpSpec:
    namespace: str
    name: str
    schema: str
    upstream: str  # where vLLM defines the op and where 0.33's Python calls it
    torch_impl: Callable
    fake_impl: Callable | None = None  # None: the op has no tensor argument; torch_impl serves both

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.name}"


# -- plain-torch implementations (real tensors) ---------------------------------------------------


def cutlass_scaled_mm_supports_block_fp8(cuda_device_capability: int) -> bool:
    """csrc/libtorch_stable/quantization/w8a8/cutlass/scaled_mm_entry.cu: SM90+ with CUDA >= 12.0 (12.8 for
    SM100+); torch 2.11's CUDA 13.0 build satisfies both."""
    return cuda_device_capability >= 90


def topk_softmax(topk_weights: torch.Tensor, topk_indices: torch.Tensor, token_expert_indices: torch.Tensor,
                 gating_output: torch.Tensor, renormalize: bool, bias: torch.Tensor | None = None,
                 is_padding: torch.Tensor | None = None) -> None:
    """csrc/moe/topk_softmax_kernels.cu: fp32 softmax over the experts, top-k (selected on ``softmax + bias``
    when a bias is given, weights from the softmax), optional renormalisation; ``token_expert_indices[t, k]
    = k * num_tokens + t``."""
    if is_padding is not None:
        raise NotImplementedError("kernelcache topk_softmax substitute: is_padding rows are not modelled")
    scores = torch.softmax(gating_output.float(), dim=-1)
    choice = scores if bias is None else scores + bias.float()
    k = topk_indices.size(1)
    ids = torch.topk(choice, k, dim=-1).indices
    weights = torch.gather(scores, 1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    topk_weights.copy_(weights)
    topk_indices.copy_(ids)
    rows = torch.arange(ids.size(0), device=ids.device, dtype=torch.int32)
    cols = torch.arange(k, device=ids.device, dtype=torch.int32)
    token_expert_indices.copy_(cols[None, :] * ids.size(0) + rows[:, None])


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_token_ids: torch.Tensor,
                         experts_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor,
                         maybe_expert_map: torch.Tensor | None = None, scatter_idx: torch.Tensor | None = None) -> None:
    """csrc/moe/moe_align_sum_kernels.cu: the flat (token, slot) indices grouped by expert in ascending
    order, each expert's group padded to a multiple of ``block_size`` with the sentinel ``topk_ids.numel()``;
    one expert id per block; the padded total. (Within an expert the CUDA kernel's order may differ: each
    row of the GEMM is computed on its own, so the result does not depend on it.)"""
    if maybe_expert_map is not None or scatter_idx is not None:
        raise NotImplementedError("kernelcache moe_align_block_size substitute: expert_map/scatter_idx (EP)")
    flat = topk_ids.flatten().long()
    counts = torch.bincount(flat, minlength=num_experts)[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    order = torch.argsort(flat, stable=True).to(torch.int32)
    starts = torch.cumsum(padded, 0) - padded
    firsts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(flat.numel(), device=flat.device) - firsts[flat[order.long()]]
    sorted_token_ids.fill_(flat.numel())
    sorted_token_ids[(starts[flat[order.long()]] + rank)] = order
    blocks = torch.repeat_interleave(torch.arange(num_experts, device=flat.device, dtype=torch.int32),
                                     padded // block_size)
    experts_ids.fill_(-1)
    experts_ids[: blocks.numel()] = blocks
    num_tokens_post_pad.fill_(int(padded.sum()))


def silu_and_mul(result: torch.Tensor, input: torch.Tensor) -> None:
    """csrc/activation_kernels.cu: ``silu(x[..., :d]) * x[..., d:]``."""
    d = input.size(-1) // 2
    result.copy_(torch.nn.functional.silu(input[..., :d]) * input[..., d:])


def moe_sum(input: torch.Tensor, output: torch.Tensor, topk_ids: torch.Tensor | None = None,
            expert_map: torch.Tensor | None = None) -> None:
    """csrc/moe/moe_align_sum_kernels.cu: ``output[t] = sum_k input[t, k]``; with ``topk_ids`` and
    ``expert_map``, slots routed to experts this rank does not hold are skipped."""
    if topk_ids is not None and expert_map is not None:
        keep = (expert_map[topk_ids.long()] >= 0).unsqueeze(-1)
        input = torch.where(keep, input, torch.zeros((), dtype=input.dtype, device=input.device))
    output.copy_(input.sum(dim=1))


def reshape_and_cache_flash(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                            k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """csrc/cache_kernels.cu ``reshape_and_cache_flash``: token i's key and value go to slot ``slot_mapping[i]``
    (block ``slot // block_size``, row ``slot % block_size``) of caches shaped ``[blocks, block_size, heads,
    head_size]``; a negative slot is padding. An fp8 cache stores ``x / scale`` in its fp8 type."""
    tokens = slot_mapping.shape[0]
    block_size = key_cache.shape[1]
    slots = slot_mapping.long()
    keep = slots >= 0
    blocks, rows = slots[keep] // block_size, slots[keep] % block_size
    for source, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        values = source[:tokens][keep]
        if kv_cache_dtype != "auto":
            fp8 = torch.float8_e5m2 if kv_cache_dtype == "fp8_e5m2" else torch.float8_e4m3fn
            cache = cache.view(fp8)
            values = (values.float() / scale.float()).to(fp8)
        cache[blocks, rows] = values.to(cache.dtype)


def _keep_buffers(*args, **kwargs) -> None:
    """Fake implementation of an op that only writes into caller-allocated buffers: nothing to compute."""
    return None


OPS = (
    OpSpec("_C", "cutlass_scaled_mm_supports_block_fp8",
           "cutlass_scaled_mm_supports_block_fp8(int cuda_device_capability) -> bool",
           "csrc/torch_bindings.cpp; called at import by "
           "w8a8_utils.CUTLASS_BLOCK_FP8_SUPPORTED at import (_custom_ops.cutlass_scaled_mm_supports_block_fp8)",
           cutlass_scaled_mm_supports_block_fp8),
    OpSpec("_moe_C", "topk_softmax",
           "topk_softmax(Tensor(a!) topk_weights, Tensor(b!) topk_indices, Tensor(c!) token_expert_indices, "
           "Tensor gating_output, bool renormalize, Tensor? bias, Tensor? is_padding) -> ()",
           "csrc/moe/torch_bindings.cpp; the router's fused_topk "
           "(fused_topk_router.vllm_topk_softmax, _custom_ops.topk_softmax)",
           topk_softmax, _keep_buffers),
    OpSpec("_moe_C", "moe_align_block_size",
           "moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, Tensor(a!) sorted_token_ids, "
           "Tensor(b!) experts_ids, Tensor(c!) num_tokens_post_pad, Tensor? maybe_expert_map, "
           "Tensor(d!)? scatter_idx) -> ()",
           "csrc/moe/torch_bindings.cpp; moe_align_block_size.moe_align_block_size (_custom_ops.moe_align_block_size)",
           moe_align_block_size, _keep_buffers),
    OpSpec("_C", "silu_and_mul", "silu_and_mul(Tensor(a!) result, Tensor input) -> ()",
           "csrc/torch_bindings.cpp; fused_moe/activation.py apply_moe_activation (SILU)",
           silu_and_mul, _keep_buffers),
    OpSpec("_moe_C", "moe_sum",
           "moe_sum(Tensor input, Tensor(a!) output, Tensor? topk_ids=None, Tensor? expert_map=None) -> ()",
           "csrc/moe/torch_bindings.cpp; TritonExperts.moe_sum (fused_moe/experts/triton_moe.py, "
           "_custom_ops.moe_sum)",
           moe_sum, _keep_buffers),
    OpSpec("_C_cache_ops", "reshape_and_cache_flash",
           "reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
           "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()",
           "csrc/torch_bindings.cpp (_C_cache_ops); FlashInferImpl.do_kv_cache_update "
           "(vllm/v1/attention/backends/flashinfer.py)",
           reshape_and_cache_flash, _keep_buffers),
)


def _present(spec: OpSpec) -> bool:
    namespace = getattr(torch.ops, spec.namespace)
    return hasattr(namespace, spec.name)


def _register(spec: OpSpec) -> None:
    library = torch.library.Library(spec.namespace, "FRAGMENT")
    _LIBRARIES.append(library)
    library.define(spec.schema)
    library.impl(spec.name, spec.torch_impl, "CompositeExplicitAutograd")
    if spec.fake_impl is not None:
        torch.library.register_fake(spec.qualname, spec.fake_impl, lib=library)


def install_ops(only: tuple[str, ...] | None = None) -> list[dict]:
    """Register every op of ``OPS`` (or of those ``only`` names, ``namespace::name``) this process lacks; returns one
    record per op registered here."""
    for spec in OPS:
        if only is not None and spec.qualname not in only:
            continue
        if not _present(spec):
            _register(spec)
            _SUBSTITUTED[spec.qualname] = {"op": spec.qualname, "upstream": spec.upstream,
                                           "fake": spec.fake_impl is not None, "torch": spec.torch_impl.__qualname__}
    return [_SUBSTITUTED[spec.qualname] for spec in OPS if spec.qualname in _SUBSTITUTED]


class _Absent(types.ModuleType):
    """A module that imports but raises when anything from it is called."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def absent(*args, **kwargs):
            raise RuntimeError(f"kernelcache import shim: {self.__name__}.{name} is not available here")

        return absent


IMPORT_SHIMS = (
    ("vllm.vllm_flash_attn", "vllm/v1/attention/backends/fa_utils.py imports it at module level on CUDA; the FA "
                             "extensions (_vllm_fa2_C/_vllm_fa3_C) do not load here"),
    ("einops", "vllm/v1/attention/ops/vit_attn_wrappers.py imports it at module level; not installed here"),
)


def install_import_shims() -> list[dict]:
    """Stand in for the modules of ``IMPORT_SHIMS`` that fail to import; returns what was replaced."""
    for name, why in IMPORT_SHIMS:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            sys.modules[name] = _Absent(name)
            _SUBSTITUTED[name] = {"module": name, "why": why, "import_error": str(exc).splitlines()[0][:200]}
    return [_SUBSTITUTED[name] for name, _ in IMPORT_SHIMS if name in _SUBSTITUTED]


def install() -> dict:
    """Import shims, then the ops: what a process needs before it imports vLLM's fused-MoE modules.
    ``ops``: what was substituted; ``ops_present``: the real ops this process has (left alone)."""
    present = [spec.qualname for spec in OPS if _present(spec) and spec.qualname not in _SUBSTITUTED]
    return {"imports": install_import_shims(), "ops": install_ops(), "ops_present": present}
