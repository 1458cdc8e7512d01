"""Drive vLLM 0.33's Mamba-2 mixer so a build holds every Triton key a hybrid model's Mamba layers ask for,
every candidate config of the autotuned SSD kernels included.

One exercise task (see exercise/worker.py), ``mamba``. It builds ``MambaMixer2`` as Nemotron-H does
(``NemotronHMambaDecoderLayer``), binds its states as the runner does (``MambaBase.bind_kv_cache``) and steps it
through the engine's profile run (``MambaMixer2._warmup_ssd_kernels``), decode, prefill and mixed batches, each
with ``Mamba2AttentionMetadataBuilder.build``. ``MambaMixer2.forward`` reaches ``causal_conv1d_*``, the SSD
kernels of ``mamba_chunk_scan_combined_varlen``, ``selective_state_update`` and, for ``n_groups == 1``,
``rms_norm_gated``. ``SWEEP``'s batch generators reach every ``== 1`` / ``% 16`` class of the counts.

In cross mode every launch of an autotuned SSD kernel compiles every candidate (exercise/layers.py's
``AutotuneCandidates``), the mixer's custom op runs its Python body (``mamba_mixer2``) and the platform answers
``is_arch_support_pdl`` as ``CudaPlatform.is_arch_support_pdl`` does. Background and what is not driven (prefix
caching, spec decode, CUDA graphs, TP > 1): docs/FAMILIES.md, "Autotuned kernels" and "mamba".
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from .drivers import cross, device_scope, require_triton
from .layers import (
    AutotuneCandidates,
    drive,
    install_ops,
    pdl_like_cuda,
    python_bodies,
    real_host,
    summary,
    tensor_parallel,
    warmup_failures,
)

LAYER_NAME = "model.layers.0.mixer"
MIXER_MODULE = "vllm.model_executor.layers.mamba.mamba_mixer2"
DTYPES = ("bfloat16", "float16")
STATE_DTYPES = ("auto", "float32", "bfloat16", "float16")
OPS = "vllm.model_executor.layers.mamba.ops"
SSD_MODULES = ("ssd_bmm", "ssd_chunk_scan", "ssd_chunk_state", "ssd_state_passing")
CONTEXT = 37  # tokens already in a request's state before a decode or a continued prefill


def mamba(*, hidden_size: int, mamba_num_heads: int, mamba_head_dim: int, ssm_state_size: int, n_groups: int,
          conv_kernel: int, chunk_size: int, dtype: str, max_num_seqs: int, max_num_batched_tokens: int,
          mamba_ssm_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
          entries: list[str] | None = None) -> dict:
    """Run the mixer over every batch composition of ``sweep``; returns what ran, compiled and was faked.

    Arguments are Nemotron-H's config.json names (plan/families/mamba.py's ``MAMBA_CONFIG_NAMES`` maps other
    architectures' names).
    ``mamba_ssm_cache_dtype``: the SSM state dtype (``auto``: the model dtype; Nemotron-H's vLLM config class
    makes ``auto`` float32, ``NemotronHForCausalLMConfig``, so pass what the server resolves). ``entries``: ``profile``,
    ``decode``, ``prefill``, ``mixed`` (default all four, in that order). TP ``t`` is built as rank 0 of ``t``:
    heads and groups sharded as
    ``MambaMixer2`` shards them, with no process group.
    """
    started = time.perf_counter()
    entries = list(entries) if entries else list(ENTRIES)
    dims = Dims(hidden_size, mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups, conv_kernel, chunk_size,
                dtype, mamba_ssm_cache_dtype, tensor_parallel_size)
    check_arguments(dims, entries)
    substitutions = prepare()
    require_triton()
    tuner = AutotuneCandidates(tuple(f"{OPS}.{name}" for name in SSD_MODULES), (f"{OPS}.triton_helpers",)) \
        if cross() else None
    with tensor_parallel(tensor_parallel_size), device_scope(), real_host(), (tuner or contextlib.nullcontext()):
        layer = make_layer(dims, max_num_seqs, max_num_batched_tokens)
        calls = drive(layer, entries, lambda e: sweep(e, max_num_seqs, max_num_batched_tokens, chunk_size),
                      forward, profile)
    return summary(describe(layer), entries, calls, substitutions, tuner, started)


@dataclass(frozen=True)
class Dims:
    hidden_size: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    dtype: str
    ssm_cache_dtype: str = "auto"
    tp: int = 1


def check_arguments(dims: Dims, entries: list[str]) -> None:
    """Refuse what the layer cannot be built for, before anything is imported."""
    if dims.dtype not in DTYPES:
        raise ValueError(f"mamba: dtype must be one of {DTYPES}, got {dims.dtype!r}")
    if dims.ssm_cache_dtype not in STATE_DTYPES:
        raise ValueError(f"mamba: mamba_ssm_cache_dtype must be one of {STATE_DTYPES}, got {dims.ssm_cache_dtype!r}")
    if dims.tp < 1 or dims.num_heads % dims.tp or (dims.n_groups % dims.tp and dims.n_groups != 1):
        raise ValueError(f"mamba: TP {dims.tp} must divide mamba_num_heads {dims.num_heads} and n_groups "
                         f"{dims.n_groups} (or n_groups == 1), as MambaMixer2 asserts")
    if dims.num_heads % dims.n_groups:
        raise ValueError(f"mamba: n_groups {dims.n_groups} must divide mamba_num_heads {dims.num_heads}")
    if set(entries) - set(ENTRIES):
        raise ValueError(f"mamba: entries must be among {sorted(ENTRIES)}, got {entries}")


def prepare() -> dict:
    """Import shims (exercise/fake_ops.py) and, in cross mode, the platform's PDL answer; returns both."""
    import vllm._custom_ops  # noqa: F401 -- loads vLLM's compiled ops where they are installed

    from . import device_tables, fake_ops

    done = fake_ops.install()
    done["ops"] += install_ops(fake_ops)
    from vllm.model_executor.layers.mamba.ops import mamba_ssm

    device_tables.track(mamba_ssm, "get_ssm_configs")  # selective_state_update's configs, by device name
    done["platform"] = pdl_like_cuda() if cross() else []
    done["calls"] = [{"call": "torch.ops.vllm.mamba_mixer2", "by": "mamba_mixer2.mamba_mixer2 (the op's Python body)",
                      "why": "under FakeTensorMode the custom op runs its fake impl, which launches no kernel"}
                     ] if cross() else []
    return done



@dataclass
class ModelConfigView:
    """What ``MambaMixer2`` and the Mamba-2 metadata builder read from ``ModelConfig``: the model dtype
    (``get_state_dtype``) and ``ModelConfig.get_mamba_chunk_size()``, with the served length."""

    dtype: Any
    chunk_size: int
    max_model_len: int

    def get_mamba_chunk_size(self) -> int:
        return self.chunk_size


@dataclass
class MambaLayer:
    """One ``MambaMixer2`` as the model builds it, its bound state, and the runner's metadata builder."""

    mixer: Any
    builder: Any  # Mamba2AttentionMetadataBuilder
    vllm_config: Any
    dims: Dims
    max_num_seqs: int
    block_table: Any = None  # [max_num_seqs, 1] int32, as MRV2's BlockTables hold a "none"-mode Mamba group
    notes: dict = field(default_factory=dict)


def make_layer(dims: Dims, max_num_seqs: int, max_num_batched_tokens: int) -> MambaLayer:
    """``MambaMixer2`` as Nemotron-H builds it, its state bound as the runner binds it, the SSU backend chosen
    as the runner chooses it (``initialize_mamba_ssu_backend``), and the metadata builder; on ``cuda``."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder

    config = vllm_config(dims, max_num_seqs, max_num_batched_tokens)
    with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype), torch.device("cuda"):
        mixer = MambaMixer2(hidden_size=dims.hidden_size, ssm_state_size=dims.state_size,
                            conv_kernel_size=dims.conv_kernel, intermediate_size=dims.num_heads * dims.head_dim,
                            use_conv_bias=True, use_bias=False, n_groups=dims.n_groups, num_heads=dims.num_heads,
                            head_dim=dims.head_dim, rms_norm_eps=1e-5, activation="silu",
                            model_config=config.model_config, cache_config=config.cache_config, prefix=LAYER_NAME)
        fill_parameters(mixer)
        spec = mixer.get_kv_cache_spec(config)
        bind_state(mixer, spec, max_num_seqs + 1)
        start_ssu_backend(config, spec)
        builder = Mamba2AttentionMetadataBuilder(spec, [LAYER_NAME], config, torch.device("cuda"))
        blocks = torch.empty((max_num_seqs, 1 + config.num_speculative_tokens), dtype=torch.int32, device="cuda")
    return MambaLayer(mixer, builder, config, dims, max_num_seqs, blocks)


def vllm_config(dims: Dims, max_num_seqs: int, max_num_batched_tokens: int) -> Any:
    """A ``VllmConfig`` with the scheduler limits, prefix caching off (``mamba_cache_mode="none"``) and the SSM
    state dtype the server resolves; ``model_config`` is ``ModelConfigView`` (no HF checkpoint here)."""
    import torch
    from vllm.config import VllmConfig

    config = VllmConfig()
    config.scheduler_config.max_num_seqs = max_num_seqs
    config.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    config.cache_config.enable_prefix_caching = False
    config.cache_config.mamba_cache_mode = "none"
    config.cache_config.mamba_ssm_cache_dtype = dims.ssm_cache_dtype
    config.cache_config.mamba_block_size = max_num_batched_tokens
    model = ModelConfigView(getattr(torch, dims.dtype), dims.chunk_size, max_num_batched_tokens)
    object.__setattr__(config, "model_config", model)
    return config


def fill_parameters(mixer: Any) -> None:
    """Native mode: seeded weights in place (the parameters were made in the model dtype, ``A`` in fp32, as
    the loader makes them under ``set_default_torch_dtype``, ``BaseModelLoader.load_model``); ``A`` negative
    and ``dt_bias`` small, as trained checkpoints have them."""
    import torch

    if cross():
        return
    generator = torch.Generator(device="cuda").manual_seed(1234)
    with torch.no_grad():
        for param in mixer.parameters():
            fan_in = param.shape[-1] if param.dim() > 1 else 1
            param.copy_(torch.randn(param.shape, generator=generator, device="cuda") / fan_in**0.5)
        mixer.A.copy_(-torch.rand(mixer.A.shape, generator=generator, device="cuda") - 0.5)
        mixer.dt_bias.copy_(torch.rand(mixer.dt_bias.shape, generator=generator, device="cuda") - 2.0)


def bind_state(mixer: Any, spec: Any, num_blocks: int) -> None:
    """One int8 page per block viewed ``[num_blocks, 1, 1, page]`` (block stride = the page, the layer-outermost
    layout, ``create_kv_cache_views``) and split into the layer's states by ``MambaBase.bind_kv_cache``."""
    import torch

    page = spec.page_size_bytes
    raw = torch.zeros(num_blocks * page, dtype=torch.int8, device="cuda")
    mixer.bind_kv_cache(raw.view(num_blocks, 1, 1, page))


def start_ssu_backend(config: Any, spec: Any) -> None:
    """``initialize_mamba_ssu_backend`` with a KV-cache config holding this layer's group, as the runner calls it."""
    from vllm.model_executor.layers.mamba.ops.ssu_dispatch import initialize_mamba_ssu_backend
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    kv_config = KVCacheConfig(num_blocks=1, kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec([LAYER_NAME], spec)])
    initialize_mamba_ssu_backend(config.mamba_config, kv_config)


# -- batches --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """One step: each request's (new tokens, tokens already in its state), decodes first."""

    requests: tuple[tuple[int, int], ...]

    @property
    def num_tokens(self) -> int:
        return sum(q for q, _ in self.requests)


def sweep(entry: str, max_num_seqs: int, max_num_batched_tokens: int, chunk_size: int) -> list[Batch]:
    """The batches of one entry (module docstring)."""
    return SWEEP[entry](max_num_seqs, max_num_batched_tokens, chunk_size)


def decode_batches(max_num_seqs: int, max_tokens: int, chunk_size: int) -> list[Batch]:
    return [Batch(((1, CONTEXT),) * b) for b in range(1, min(max_num_seqs, max_tokens) + 1)]


def prefill_lengths(max_tokens: int, chunk_size: int) -> list[int]:
    """Lengths reaching each ``== 1`` / ``% 16`` class of the token count and of the chunk count."""
    small = set(range(1, 34)) | {chunk_size - 1, chunk_size, chunk_size + 1, 2 * chunk_size, 2 * chunk_size + 1,
                                 16 * chunk_size, 16 * chunk_size + 1, 17 * chunk_size, max_tokens, max_tokens - 1}
    return sorted(n for n in small if 1 <= n <= max_tokens)


def prefill_batches(max_num_seqs: int, max_tokens: int, chunk_size: int) -> list[Batch]:
    """Single prompts (fresh, and continuing a chunked prefill off the chunk grid), then several prompts."""
    batches = [Batch(((n, 0),)) for n in prefill_lengths(max_tokens, chunk_size)]
    batches += [Batch(((n, CONTEXT),)) for n in prefill_lengths(max_tokens, chunk_size) if n > 1]
    for count in sorted({2, 3, 16, 17, max_num_seqs}):
        if 2 * count <= max_tokens and count <= max_num_seqs:
            batches.append(Batch(((2, 0),) * count))
            batches.append(Batch(((max_tokens // count, CONTEXT),) * count))
    return batches


def mixed_batches(max_num_seqs: int, max_tokens: int, chunk_size: int) -> list[Batch]:
    """Decodes followed by one or two prefills (one continuing, as the scheduler chunks a long prompt)."""
    batches = []
    for decodes in sorted({1, 2, 15, 16, 17, max_num_seqs - 1}):
        if 1 <= decodes < max_num_seqs:
            for prompt in sorted({1 + 1, 17, chunk_size + 1, max_tokens - decodes}):
                if 2 <= prompt <= max_tokens - decodes:
                    batches.append(Batch(((1, CONTEXT),) * decodes + ((prompt, 0),)))
                    batches.append(Batch(((1, CONTEXT),) * decodes + ((prompt, CONTEXT),)))
    return batches


def profile_batches(max_num_seqs: int, max_tokens: int, chunk_size: int) -> list[Batch]:
    """The engine's profile run: one step of ``max_num_batched_tokens`` dummy tokens, run by ``profile``."""
    return [Batch(((max_tokens, 0),))]


SWEEP = {"profile": profile_batches, "decode": decode_batches, "prefill": prefill_batches, "mixed": mixed_batches}
ENTRIES = tuple(SWEEP)


def common_metadata(layer: MambaLayer, batch: Batch) -> Any:
    """The step's ``CommonAttentionMetadata`` as MRV2's ``build_attn_metadata`` fills it."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    query = [q for q, _ in batch.requests]
    seq_lens = [q + c for q, c in batch.requests]
    starts = torch.tensor([0, *query], dtype=torch.int32).cumsum(0).to(torch.int32)
    num_reqs, num_tokens = len(query), batch.num_tokens
    return CommonAttentionMetadata(
        query_start_loc=torch.empty(num_reqs + 1, dtype=torch.int32, device="cuda").copy_(starts),
        query_start_loc_cpu=starts, seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=num_reqs,
        num_actual_tokens=num_tokens, max_query_len=max(query), max_seq_len=max(seq_lens),
        block_table_tensor=layer.block_table[:num_reqs],
        slot_mapping=torch.zeros(num_tokens, dtype=torch.int64, device="cuda"),
        is_prefilling=torch.tensor([q > 1 or c == 0 for q, c in batch.requests]))


def fill_block_table(layer: MambaLayer, batch: Batch) -> None:
    """Request ``i`` owns state block ``i + 1`` (block 0 is vLLM's null block)."""
    import torch

    if not cross():
        rows = torch.arange(1, len(batch.requests) + 1, dtype=torch.int32, device="cuda")
        layer.block_table[: len(batch.requests), 0] = rows


def forward(layer: MambaLayer, batch: Batch, hidden: Any) -> Any:
    """One step: the builder's metadata, then ``MambaMixer2.forward`` under the forward context."""
    fill_block_table(layer, batch)
    metadata = layer.builder.build(0, common_metadata(layer, batch))
    return step(layer, {LAYER_NAME: metadata}, batch.num_tokens, hidden)


def step(layer: MambaLayer, metadata: dict | None, num_tokens: int, hidden: Any) -> Any:
    """``MambaMixer2.forward`` under the forward context holding ``metadata`` (None: the profile run's)."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    with set_current_vllm_config(layer.vllm_config), \
            set_forward_context(metadata, layer.vllm_config, num_tokens=num_tokens), \
            python_bodies(MIXER_MODULE, ("mamba_mixer2",)):
        return layer.mixer.forward(hidden)


def profile(layer: MambaLayer, batch: Batch, hidden: Any) -> Any:
    """The profile run's step: ``MambaMixer2.forward`` with no attention metadata (the runner's ``_dummy_run``
    for ``profile_run``), which warms the SSD kernels (``_warmup_ssd_kernels``); a warmup failure raises."""
    with warmup_failures(MIXER_MODULE):
        return step(layer, None, batch.num_tokens, hidden)



def describe(layer: MambaLayer) -> dict:
    """What vLLM chose for this layer: SSU backend, norm path, state layout and dtypes, chunk size."""
    from vllm.model_executor.layers.mamba.ops.ssu_dispatch import get_mamba_ssu_backend

    mixer = layer.mixer
    conv_state, ssm_state = mixer.kv_cache[:2]
    norm = mixer.norm
    grouped = norm.n_groups != 1 or norm.n_groups % norm.tp_size != 0
    return {"entry": "vllm.model_executor.layers.mamba.mamba_mixer2.MambaMixer2.forward",
            "ssu_backend": get_mamba_ssu_backend().name, "chunk_size": layer.builder.chunk_size,
            "norm": "forward_native (torch)" if grouped or not norm.enabled() else "rms_norm_gated (Triton)",
            "conv_state": {"shape": list(conv_state.shape), "stride": list(conv_state.stride()),
                           "dtype": str(conv_state.dtype).removeprefix("torch.")},
            "ssm_state": {"shape": list(ssm_state.shape), "stride": list(ssm_state.stride()),
                          "dtype": str(ssm_state.dtype).removeprefix("torch.")},
            "dtype": layer.dims.dtype, "tensor_parallel_size": layer.dims.tp, "max_num_seqs": layer.max_num_seqs}
