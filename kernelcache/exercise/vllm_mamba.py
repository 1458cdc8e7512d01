"""Drive vLLM 0.33's Mamba-2 mixer so a build holds every Triton key a hybrid model's Mamba layers ask for,
every candidate config of the autotuned SSD kernels included.

One exercise task (see exercise/worker.py), ``mamba``. It builds ``MambaMixer2`` as Nemotron-H does
(``NemotronHMambaDecoderLayer``), binds its states as the runner does (``MambaBase.bind_kv_cache``) and steps it
through the engine's profile run (``MambaMixer2._warmup_ssd_kernels``), decode, prefill and mixed batches, each
with ``Mamba2AttentionMetadataBuilder.build``. ``MambaMixer2.forward`` reaches ``causal_conv1d_*``, the SSD
kernels of ``mamba_chunk_scan_combined_varlen``, ``selective_state_update`` and, for ``n_groups == 1``,
``rms_norm_gated``. ``SWEEP``'s batch generators reach every ``== 1`` / ``% 16`` class of the counts.

``AutotuneCandidates``: in cross mode every launch of an autotuned kernel compiles every candidate that Triton's
own ``Autotuner.prune_configs`` keeps, with a compile-only benchmark and no autotune JSON written; the GPU still
times them at first launch unless ``kernelcache tune`` put its choices in the bundle. exercise/vllm_gdn.py reuses
it. Cross mode also calls ``mamba_mixer2`` (the op's Python body) and answers ``is_arch_support_pdl`` as
``CudaPlatform.is_arch_support_pdl`` does. Background and what is not driven (prefix caching, spec decode, CUDA
graphs, TP > 1): docs/FAMILIES.md, "Autotuned kernels" and "mamba".
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .drivers import cross, device_scope, require_triton

LAYER_NAME = "model.layers.0.mixer"
MIXER_MODULE = "vllm.model_executor.layers.mamba.mamba_mixer2"
DTYPES = ("bfloat16", "float16")
STATE_DTYPES = ("auto", "float32", "bfloat16", "float16")
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
    tuner = AutotuneCandidates() if cross() else None
    with tensor_parallel(tensor_parallel_size), device_scope(), real_host(), (tuner or contextlib.nullcontext()):
        layer = make_layer(dims, max_num_seqs, max_num_batched_tokens)
        calls = drive(layer, entries, lambda e: sweep(e, max_num_seqs, max_num_batched_tokens, chunk_size),
                      forward, profile)
    return summary(describe(layer), entries, calls, substitutions, tuner, started)


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


# -- the layer, its state and its metadata builder ------------------------------------------------------------


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


def random_hidden(layer: MambaLayer, batch: Batch) -> Any:
    import torch

    generator = None if cross() else torch.Generator(device="cuda").manual_seed(batch.num_tokens)
    dtype = getattr(torch, layer.dims.dtype)
    return torch.randn((batch.num_tokens, layer.dims.hidden_size), generator=generator, device="cuda").to(dtype)


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
    """Cross mode: every launch of an autotuned Mamba kernel compiles all candidates (module docstring)."""

    def __init__(self) -> None:
        self.kernels: dict[str, Any] = {}
        self.candidates: dict[str, set] = {}
        self.keys: dict[str, set] = {}
        self.saved: list = []

    def __enter__(self) -> AutotuneCandidates:
        import importlib

        from triton.runtime.autotuner import Autotuner

        helpers = importlib.import_module("vllm.model_executor.layers.mamba.ops.triton_helpers")
        self.saved.append((helpers, "_autotuned_configs", helpers._autotuned_configs))
        helpers._autotuned_configs = _NeverStore()
        for name in SSD_MODULES:
            module = importlib.import_module(f"vllm.model_executor.layers.mamba.ops.{name}")
            for kernel in vars(module).values():
                if isinstance(kernel, Autotuner) and kernel.base_fn.__name__ not in self.kernels:
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


# -- summary --------------------------------------------------------------------------------------------------


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
