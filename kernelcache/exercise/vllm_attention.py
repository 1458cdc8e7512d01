"""Drive vLLM 0.33's Triton attention backend (``TRITON_ATTN``) so a build holds every key a server asks for.

One exercise task (see exercise/worker.py), ``attention``. It builds one decoder attention layer as a server
started with ``--attention-backend TRITON_ATTN`` does (``Attention`` with ``TritonAttentionImpl``, the KV cache
viewed by ``create_kv_cache_views``, Model Runner V2's block table) inside a real ``VllmConfig``, and steps it
through CUDA-graph capture, decode, short-query, prefill and mixed batches of every request count, once per
sliding window. Each step mirrors ``build_attn_metadata`` -> ``TritonAttentionMetadataBuilder.build`` ->
``triton_reshape_and_cache_flash`` + ``unified_attention`` (2D, or 3D + ``reduce_segments``).

The keys turn on ``unified_attention``'s 2D/3D choice (its threshold set in
``TritonAttentionMetadataBuilder.__init__`` from the capture sizes) and the ``== 1`` / ``% 16`` class of
``num_seqs``, so every batch size is run rather than the classes derived. In cross mode the layer is called
directly (``use_direct_call``) on FakeTensors. Background, what decides the keys and what is not covered (FP8
KV cache, speculative decoding, ALiBi, sinks, …): docs/FAMILIES.md, "attention".
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..plan.families.attention import CONTACTS
from ..plan.releases import resolve, since
from .drivers import cross, device_scope, require_triton
from .vllm_runner import block_table_width as runner_width

LAYER_NAME = "model.layers.0.self_attn.attn"
DTYPES = ("bfloat16", "float16")
KV_CACHE_DTYPES = ("auto",)
MAX_3D_QUERY_LEN = 8  # vllm.v1.attention.ops.triton_unified_attention.MAX_3D_QUERY_LEN
PAD_SLOT_ID = -1  # vllm/v1/attention/backends/utils.py PAD_SLOT_ID


@dataclass(frozen=True)
class Shape:
    """One model's attention, as one tensor-parallel rank holds it."""

    num_heads: int  # per rank
    num_kv_heads: int  # per rank
    head_size: int
    dtype: str
    kv_cache_dtype: str
    block_size: int
    sliding_window: int  # 0: none
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int


class AttentionModel:
    """The parts of ``ModelConfig`` the ``Attention`` layer and ``TritonAttentionMetadataBuilder`` read, for
    one rank: ``get_num_attention_heads`` / ``get_num_kv_heads`` (vllm/config/model.py, per-rank counts),
    ``get_head_size``, ``dtype``, ``rswa_window``, ``is_mm_prefix_lm`` and ``enforce_eager``."""

    def __init__(self, shape: Shape) -> None:
        import torch

        self.shape = shape
        self.dtype = getattr(torch, shape.dtype)
        self.rswa_window = None
        self.is_mm_prefix_lm = False
        self.enforce_eager = False
        self.max_model_len = shape.max_model_len

    def get_num_attention_heads(self, parallel_config: Any = None) -> int:
        return self.shape.num_heads

    def get_num_kv_heads(self, parallel_config: Any = None) -> int:
        return self.shape.num_kv_heads

    def get_head_size(self) -> int:
        return self.shape.head_size


@dataclass
class AttentionState:
    """One attention layer with its KV cache, metadata builder and Model Runner V2's input buffers."""

    shape: Shape
    config: Any  # VllmConfig
    layer: Any  # vllm.model_executor.layers.attention.Attention
    builder: Any  # TritonAttentionMetadataBuilder
    kv_cache: Any
    block_table: Any  # [max_num_seqs, width] int32
    query_start_loc: Any  # [max_num_seqs + 1] int32
    seq_lens: Any  # [max_num_seqs] int32
    slot_mapping: Any  # [max_num_batched_tokens] int64
    num_blocks: int
    calls: dict = field(default_factory=dict)
    paths: dict = field(default_factory=dict)

    @property
    def width(self) -> int:
        return self.block_table.shape[1]


def attention(*, num_heads: int, num_kv_heads: int, head_size: int, dtype: str, kv_cache_dtype: str = "auto",
              block_size: int = 16, max_num_seqs: int = 256, max_model_len: int = 8192,
              max_num_batched_tokens: int = 8192, sliding_window: int = 0, tensor_parallel_size: int = 1,
              entries: list[str] | None = None) -> dict:
    """Capture, decode, short-query and prefill/mixed batches through one TRITON_ATTN layer (module docstring).

    ``num_heads`` / ``num_kv_heads``: the model's totals; one rank holds ``num_heads / tp`` query heads and
    ``max(1, num_kv_heads / tp)`` KV heads. ``entries``: any of ``ENTRIES`` (default: all).
    """
    started = time.perf_counter()
    entries = list(entries) if entries else list(ENTRIES)
    shape = rank_shape(num_heads, num_kv_heads, head_size, dtype, kv_cache_dtype, block_size, max_num_seqs,
                       max_model_len, max_num_batched_tokens, sliding_window, tensor_parallel_size, entries)
    substitutions = prepare()
    require_triton()
    with device_scope(), target_queries() as faked:
        state = make_state(shape)
        for entry in entries:
            ENTRIES[entry](state)
    return {**describe(state), "entries": entries, "tensor_parallel_size": tensor_parallel_size,
            "substitutions": {**substitutions, "torch_cuda": faked}, "calls": state.calls,
            "seconds": round(time.perf_counter() - started, 2)}


def rank_shape(num_heads: int, num_kv_heads: int, head_size: int, dtype: str, kv_cache_dtype: str,
               block_size: int, max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int,
               sliding_window: int, tensor_parallel_size: int, entries: list[str]) -> Shape:
    """Check the arguments before anything is imported; one rank's heads as vLLM shards them
    (vllm/config/model.py ``get_num_attention_heads`` / ``get_num_kv_heads``)."""
    tp = tensor_parallel_size
    if dtype not in DTYPES:
        raise ValueError(f"attention: dtype must be one of {DTYPES}, got {dtype!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"attention: kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    if tp < 1 or num_heads % tp or num_heads % num_kv_heads or (num_kv_heads % tp and tp % num_kv_heads):
        raise ValueError(f"attention: {num_heads} heads / {num_kv_heads} KV heads cannot be split over TP {tp}")
    if block_size % 16 or head_size < 32:
        raise ValueError("attention: TRITON_ATTN needs block_size % 16 == 0 and head_size >= 32 "
                         "(triton_attn.py supports_block_size / supports_head_size)")
    if min(max_num_seqs, max_model_len, max_num_batched_tokens) < 1 or sliding_window < 0:
        raise ValueError("attention: sizes must be positive and sliding_window >= 0")
    if set(entries) - set(ENTRIES):
        raise ValueError(f"attention: entries must be among {sorted(ENTRIES)}, got {entries}")
    return Shape(num_heads // tp, max(1, num_kv_heads // tp), head_size, dtype, kv_cache_dtype, block_size,
                 sliding_window, max_num_seqs, max_model_len, max_num_batched_tokens)


def prepare() -> dict:
    """The import shims of exercise/fake_ops.py (``vllm.vllm_flash_attn``, ``einops``), before vLLM's
    attention modules are imported; the real modules are used where they import."""
    from . import fake_ops

    return {"imports": fake_ops.install_import_shims()}


@contextlib.contextmanager
def target_queries():
    """Cross mode: ``torch.cuda.get_device_capability`` answers the target's capability, as the GPU does
    (``triton_reshape_and_cache_flash`` reads it to cap ``TILE_SIZE`` below SM90). Yields what was faked."""
    if not cross():
        yield []
        return
    import torch
    import triton

    target = triton.runtime.driver.active.get_current_target()
    capability = (target.arch // 10, target.arch % 10)
    original = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: capability
    try:
        yield [{"call": "torch.cuda.get_device_capability", "returns": list(capability),
                "upstream": "triton_reshape_and_cache_flash (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py)"}]
    finally:
        torch.cuda.get_device_capability = original


# -- construction ---------------------------------------------------------------------------------


def server_config(shape: Shape, full_cuda_graphs: bool = True) -> Any:
    """A ``VllmConfig`` with the server's scheduler, cache and compilation configs and, under the default
    ``-O2``, ``FULL_AND_PIECEWISE`` CUDA graphs with the capture sizes vLLM computes itself."""
    from vllm.config import CacheConfig, CompilationConfig, CUDAGraphMode, SchedulerConfig, VllmConfig

    scheduler = SchedulerConfig(max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
                                max_model_len=shape.max_model_len, is_encoder_decoder=False)
    cache = CacheConfig(block_size=shape.block_size, cache_dtype=shape.kv_cache_dtype)
    config = VllmConfig(scheduler_config=scheduler, cache_config=cache, compilation_config=CompilationConfig())
    object.__setattr__(config, "model_config", AttentionModel(shape))
    compilation = config.compilation_config
    compilation.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE if full_cuda_graphs else CUDAGraphMode.NONE
    compilation.cudagraph_capture_sizes = None if full_cuda_graphs else []
    compilation.max_cudagraph_capture_size = None if full_cuda_graphs else 0
    if full_cuda_graphs:
        config._set_cudagraph_sizes()  # VllmConfig._set_cudagraph_sizes, as VllmConfig.__post_init__ calls it
    return config


def make_state(shape: Shape, num_blocks: int | None = None) -> AttentionState:
    """The layer, its KV cache, the metadata builder and the runner's buffers, on ``cuda``."""
    import torch

    config = server_config(shape)
    layer = make_layer(shape, config)
    spec = layer.get_kv_cache_spec(config)
    width = block_table_width(shape)
    num_blocks = num_blocks or shape.max_num_seqs * width + 1
    with torch.device("cuda"):
        kv_cache = make_kv_cache(config, spec, num_blocks)
        layer.kv_cache = kv_cache  # what bind_kv_cache does for an Attention layer
        builder = layer.attn_backend.get_builder_cls()(spec, [LAYER_NAME], config, torch.device("cuda"))
        seqs, tokens = shape.max_num_seqs, shape.max_num_batched_tokens
        return AttentionState(shape, config, layer, builder, kv_cache,
                              torch.zeros((seqs, width), dtype=torch.int32),
                              torch.zeros(seqs + 1, dtype=torch.int32), torch.zeros(seqs, dtype=torch.int32),
                              torch.zeros(tokens, dtype=torch.int64), num_blocks)


def make_layer(shape: Shape, config: Any, backend: Any = None, **extra: Any) -> Any:
    """``Attention`` as Llama builds it (models/llama.py), with the TRITON_ATTN backend (or ``backend``), weights
    "loaded"; ``extra``: more of ``Attention``'s arguments (``logits_soft_cap``)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention import Attention
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    dtype = getattr(torch, shape.dtype)
    # The model is built under its dtype as torch's default (model_loader's initialize_model): from 0.34 the layer
    # keeps that as its act_dtype and process_weights_after_loading takes no argument; 0.33's took the dtype.
    with set_current_vllm_config(config), set_default_torch_dtype(dtype), torch.device("cuda"):
        layer = Attention(shape.num_heads, shape.head_size, shape.head_size**-0.5, num_kv_heads=shape.num_kv_heads,
                          cache_config=config.cache_config, per_layer_sliding_window=shape.sliding_window or None,
                          prefix=LAYER_NAME, attn_backend=backend or TritonAttentionBackend, **extra)
        loaded = resolve(CONTACTS, "process_weights_after_loading")
        loaded(layer) if since("0.34") else loaded(layer, dtype)
    layer.use_direct_call = True  # the custom op's Python body, as in the module docstring
    return layer


def block_table_width(shape: Shape) -> int:
    """Model Runner V2's block-table width for one full-attention group (``GPUModelRunner.initialize_kv_cache``)."""
    return runner_width(shape.max_model_len, shape.block_size)


def make_kv_cache(config: Any, spec: Any, num_blocks: int, backend: Any = None) -> Any:
    """One layer's view of the KV-cache allocation, in the layout the engine resolves for this backend (TRITON_ATTN
    unless ``backend`` is given) (``resolve_kv_cache_layout``; ``get_kv_cache_config_from_groups``'s block stride;
    ``allocate_kv_cache`` in vllm/v1/worker/utils.py)."""
    import torch
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.kv_cache_interface import KVCacheTensor, compute_layout_strides, create_kv_cache_views

    names = [layout.name for layout in get_supported_kv_cache_layouts([backend or TritonAttentionBackend])]
    layout = resolve_kv_cache_layout(config, [names], [spec])
    layer_stride, block_stride, _, _, _ = compute_layout_strides(spec, num_blocks, 1, layout)
    size = spec.page_size_bytes * num_blocks
    tensor = KVCacheTensor(size=size, layers=[LAYER_NAME], layer_stride=layer_stride, block_stride=block_stride)
    buffer = torch.zeros(size, dtype=torch.int8)
    (view,) = create_kv_cache_views(buffer, spec, num_blocks, layout, tensor)
    return view


# -- one step -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """A scheduled step: per request, the new tokens and the context length after them."""

    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    pad_reqs: int = 0  # requests added by CUDA-graph padding (seq_len 0, no tokens)
    capture: bool = False

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


def fill(state: AttentionState, batch: Batch) -> Any:
    """Write the step's query starts, sequence lengths, block-table rows and slot mappings into the runner's
    buffers (values: each request owns ``width`` consecutive blocks, modulo the cache); returns the
    ``CommonAttentionMetadata`` as MRV2's ``build_attn_metadata`` builds it."""
    import numpy as np
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    reqs = len(batch.query_lens) + batch.pad_reqs
    query_lens = np.array([*batch.query_lens, *[0] * batch.pad_reqs], dtype=np.int32)
    seq_lens = np.array([*batch.seq_lens, *[0] * batch.pad_reqs], dtype=np.int32)
    starts = np.zeros(reqs + 1, dtype=np.int32)
    np.cumsum(query_lens, out=starts[1:])
    blocks = (np.arange(reqs, dtype=np.int64)[:, None] * state.width + np.arange(state.width)) % state.num_blocks
    slots = slot_mapping(batch, blocks, state.shape.block_size)
    host = _host
    state.query_start_loc[: reqs + 1].copy_(host(starts))
    state.seq_lens[:reqs].copy_(host(seq_lens))
    state.block_table[:reqs].copy_(host(blocks.astype(np.int32)))
    state.slot_mapping[: len(slots)].copy_(host(slots))
    max_seq_len = state.shape.max_model_len if batch.capture else int(seq_lens.max())
    return CommonAttentionMetadata(
        query_start_loc=state.query_start_loc[: reqs + 1], query_start_loc_cpu=host(starts),
        seq_lens=state.seq_lens[:reqs], seq_lens_cpu_upper_bound=host(seq_lens), max_seq_len=max_seq_len,
        num_reqs=reqs, num_actual_tokens=batch.num_tokens, max_query_len=int(query_lens.max()),
        block_table_tensor=state.block_table[:reqs], slot_mapping=state.slot_mapping[: batch.num_tokens],
        causal=True, is_prefilling=torch.from_numpy(query_lens > 1))


def slot_mapping(batch: Batch, blocks: Any, block_size: int) -> Any:
    import numpy as np

    slots = []
    for req, (q, s) in enumerate(zip(batch.query_lens, batch.seq_lens)):
        positions = np.arange(s - q, s)
        slots.append(blocks[req, positions // block_size] * block_size + positions % block_size)
    return np.concatenate(slots).astype(np.int64) if slots else np.zeros(0, dtype=np.int64)


def _host(array: Any) -> Any:
    """``torch.from_numpy``: a real CPU tensor, as on the GPU machine (FakeTensorMode would lift it)."""
    import torch

    with torch.utils._python_dispatch._disable_current_modes():
        return torch.from_numpy(array)


def qkv(state: AttentionState, num_tokens: int, generator: Any = None) -> tuple[Any, Any, Any]:
    """q, k, v as Llama's attention hands them to the layer: views of one ``qkv_proj`` output
    (``qkv.split([q_size, kv_size, kv_size], dim=-1)``, models/llama.py)."""
    import torch

    shape = state.shape
    q_size, kv_size = shape.num_heads * shape.head_size, shape.num_kv_heads * shape.head_size
    kwargs = {"generator": generator} if generator is not None else {}
    fused = torch.randn((num_tokens, q_size + 2 * kv_size), dtype=getattr(torch, shape.dtype), device="cuda",
                        **kwargs)
    return fused.split([q_size, kv_size, kv_size], dim=-1)


def step(state: AttentionState, batch: Batch, tensors: tuple[Any, Any, Any] | None = None) -> Any:
    """The builder on the step's metadata, then ``Attention.forward`` under the step's forward context."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    common = fill(state, batch)
    build = state.builder.build_for_cudagraph_capture if batch.capture else partial(state.builder.build, 0)
    metadata = build(common)
    q, k, v = tensors if tensors is not None else qkv(state, batch.num_tokens)
    slots = {LAYER_NAME: state.slot_mapping[: batch.num_tokens]}
    with set_current_vllm_config(state.config), set_forward_context({LAYER_NAME: metadata}, state.config,
                                                                     slot_mapping=slots):
        out = state.layer.forward(q, k, v)
    path = path_of(state, batch, metadata)
    state.paths[path] = state.paths.get(path, 0) + 1
    return out


def path_of(state: AttentionState, batch: Batch, metadata: Any) -> str:
    """The kernel ``unified_attention`` launches for this step (its 2D/3D rule, ops/triton_unified_attention.py:
    1070-1091) and the ``num_seqs`` class: ``3D:1``, ``2D:16n``, ``3D:other``..."""
    from vllm.triton_utils import triton

    shape = state.shape
    per_kv = shape.num_heads // shape.num_kv_heads
    block_q = (16 if per_kv <= 16 else triton.next_power_of_2(per_kv)) // per_kv
    num_seqs = len(batch.query_lens) + batch.pad_reqs
    max_q = max(batch.query_lens)
    use_3d = (max_q <= MAX_3D_QUERY_LEN and num_seqs * triton.cdiv(max_q, block_q) <= metadata.seq_threshold_3D
              and metadata.softmax_segm_max.shape[0] >= batch.num_tokens)
    klass = "1" if num_seqs == 1 else "16n" if num_seqs % 16 == 0 else "other"
    return f"{'3D' if use_3d else '2D'}:{klass}"


# -- the batch sweeps -----------------------------------------------------------------------------


def context(i: int, query: int, shape: Shape) -> int:
    """A context length for request ``i`` with ``query`` new tokens: spread over 1..max_model_len."""
    spread = (i * 2654435761) % shape.max_model_len + 1
    return max(query, min(shape.max_model_len, spread))


def capture(state: AttentionState) -> None:
    """CUDA-graph capture of uniform decode batches (``build_for_cudagraph_capture``, max_seq_len =
    max_model_len), one per capture size up to ``max_num_seqs``."""
    shape = state.shape
    sizes = [s for s in state.config.compilation_config.cudagraph_capture_sizes or [] if s <= shape.max_num_seqs]
    for size in sizes:
        run(state, "capture", Batch((1,) * size, tuple(context(i, 1, shape) for i in range(size)), capture=True))


def decode(state: AttentionState) -> None:
    """Uniform decode batches of every size 1..max_num_seqs (unpadded) and, for each size a full CUDA graph
    serves, padded to its capture size (padding requests have no tokens and seq_len 0)."""
    shape = state.shape
    sizes = sorted(state.config.compilation_config.cudagraph_capture_sizes or [])
    for b in range(1, min(shape.max_num_seqs, shape.max_num_batched_tokens) + 1):
        batch = Batch((1,) * b, tuple(context(i, 1, shape) for i in range(b)))
        run(state, "decode", batch)
        padded = next((s for s in sizes if s >= b), None)
        if padded is not None and padded != b and padded <= shape.max_num_seqs:
            run(state, "decode_padded", Batch(batch.query_lens, batch.seq_lens, pad_reqs=padded - b))


def short_queries(state: AttentionState) -> None:
    """Batches whose longest query is 2..8 tokens (a chunked prefill's tail, a short prompt), every request
    count up to the point where the batch leaves the 3D path, plus one beyond it."""
    shape = state.shape
    for q in range(2, MAX_3D_QUERY_LEN + 1):
        for reqs in range(1, shape.max_num_seqs + 1):
            if q * reqs > shape.max_num_batched_tokens:
                break
            lens = (q,) + (1,) * (reqs - 1)
            run(state, "short", Batch(lens, tuple(context(i, n, shape) for i, n in enumerate(lens))))
            if reqs > state.builder.seq_threshold_3D + 1:
                break


def prefill(state: AttentionState) -> None:
    """Prefill and mixed batches: for every request count 1..max_num_seqs, one prefill chunk (the token
    budget left by the decodes, capped by max_model_len) and decodes; plus single prompts of every power
    of two up to the budget, with and without a cached prefix."""
    shape = state.shape
    budget = shape.max_num_batched_tokens
    for reqs in range(1, shape.max_num_seqs + 1):
        chunk = min(budget - (reqs - 1), shape.max_model_len)
        if chunk <= MAX_3D_QUERY_LEN:
            break
        lens = (chunk,) + (1,) * (reqs - 1)
        run(state, "mixed", Batch(lens, tuple(context(i, n, shape) for i, n in enumerate(lens))))
    length = MAX_3D_QUERY_LEN + 1
    while length <= min(budget, shape.max_model_len):
        run(state, "prefill", Batch((length,), (length,)))
        run(state, "prefill", Batch((length,), (min(shape.max_model_len, 2 * length),)))
        length *= 2


def eager(state: AttentionState) -> None:
    """Decode batches under ``--enforce-eager`` (no CUDA graphs: threshold ``128 // kv_heads``)."""
    import torch

    config = server_config(state.shape, full_cuda_graphs=False)
    config.compilation_config.static_forward_context[LAYER_NAME] = state.layer  # as Attention.__init__ registers it
    with torch.device("cuda"):
        builder = state.layer.attn_backend.get_builder_cls()(state.builder.kv_cache_spec, [LAYER_NAME], config,
                                                               torch.device("cuda"))
    eager_state = AttentionState(**{**state.__dict__, "config": config, "builder": builder, "paths": state.paths,
                                    "calls": state.calls})
    for b in range(1, min(state.shape.max_num_seqs, state.shape.max_num_batched_tokens) + 1):
        run(eager_state, "eager_decode", Batch((1,) * b, tuple(context(i, 1, state.shape) for i in range(b))))


def run(state: AttentionState, kind: str, batch: Batch) -> None:
    step(state, batch)
    state.calls[kind] = state.calls.get(kind, 0) + 1


ENTRIES = {"capture": capture, "decode": decode, "short": short_queries, "prefill": prefill, "eager": eager}


def describe(state: AttentionState) -> dict:
    """What vLLM chose: backend, impl, layout, thresholds, capture sizes, and which paths ran."""
    shape = state.shape
    compilation = state.config.compilation_config
    return {"entry": "vllm.model_executor.layers.attention.Attention(attn_backend=TritonAttentionBackend).forward",
            "backend": state.layer.attn_backend.get_name(), "impl": type(state.layer.impl).__name__,
            "builder": type(state.builder).__name__, "rank_shape": shape.__dict__,
            "kv_cache": {"shape": list(state.kv_cache.shape), "stride": list(state.kv_cache.stride()),
                         "dtype": str(state.kv_cache.dtype).removeprefix("torch."),
                         "layout": state.config.cache_config.kv_cache_layout},
            "block_table_width": state.width, "cudagraph_mode": compilation.cudagraph_mode.name,
            "cudagraph_capture_sizes": compilation.cudagraph_capture_sizes,
            "seq_threshold_3D": state.builder.seq_threshold_3D,
            "eager_threshold": 128 // shape.num_kv_heads,
            "scratch_rows_3d": state.builder.softmax_segm_max.shape[0], "paths": dict(sorted(state.paths.items()))}
