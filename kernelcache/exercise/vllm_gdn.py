"""Drive vLLM 0.33's gated-delta-net layer so a build holds every Triton key a Qwen3-Next / Qwen3.5 model's linear
attention layers ask for, every candidate config of the autotuned FLA kernels included.

One exercise task (see exercise/worker.py), ``gdn``. It builds ``QwenGatedDeltaNetAttention`` (the Qwen3-Next or
Qwen3.5 layout), binds its states out of a page padded as ``Platform._align_hybrid_block_size`` pads it, and steps
it through the engine's profile run (``_warmup_prefill_kernels``), decode (with drafts, spec-decode rows), prefill
and mixed batches, each with ``GDNAttentionMetadataBuilder.build``. ``forward_cuda`` -> ``_forward_core`` reaches
the conv kernels, the chunked gated delta rule (``ChunkGatedDeltaRule``'s FLA kernels, or FlashInfer's prefill:
``_resolve_gdn_prefill_backend``) and the recurrent decode kernels.

Autotuned FLA kernels compile every candidate, with exercise/layers.py's ``AutotuneCandidates``. In cross
mode torch's CUDA queries answer as on the target while FLA's modules import (``cuda_answers``: FLA's
``is_nvidia_hopper`` and ``check_shared_mem`` pick warp counts and block sizes; where FLA's import leaves CUDA
uninitialised, as on vLLM 0.34, ``chunk_fwd_kernel_o`` also compiles the candidates of a process that imports it
before CUDA is up: ``uninitialised_configs``), the layer's custom ops resolve to their Python bodies, and
``_C::fused_gdn_decode_post_conv_mtp`` is faked where absent (its presence decides Qwen3.5's drafts path).
Background and what is not driven: docs/FAMILIES.md, "gdn".
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from . import layers
from .drivers import answering_flash_attn_version, cross, device_scope, fa_version, require_triton
from .layers import (
    AutotuneCandidates,
    autotuners,
    config_label,
    drive,
    python_bodies,
    real_host,
    summary,
    tensor_parallel,
    warmup_failures,
)

LAYER_NAME = "model.layers.0.linear_attn"
DTYPES = ("bfloat16", "float16")  # chunk_gated_delta_rule refuses float32
STATE_DTYPES = ("auto", "float32", "bfloat16", "float16")
PREFILL_BACKENDS = ("auto", "triton", "flashinfer")
LAYOUTS = ("interleaved", "flat")  # Qwen3-Next's fused qkvz/ba projections; Qwen3.5's separate ones
ATTENTION_BACKENDS = ("auto", "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
FLA = "vllm.third_party.flash_linear_attention.ops"
FLA_MODULES = ("cumsum", "chunk_scaled_dot_kkt", "solve_tril", "wy_fast", "chunk_delta_h", "chunk_o", "l2norm")
CHUNK = 64  # FLA_CHUNK_SIZE (ops/utils.py): every chunk kernel's BT
CONTEXT = 37  # tokens already in a request's state before a decode or a continued prefill
GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
# Modules that read the TP world size and rank: the linear layers and the GDN base class (GatedDeltaNetAttention).
TP_USERS = (*layers.TP_USERS, "vllm.model_executor.layers.mamba.gdn.base")
CORE_OPS = ("qwen_gdn_attention_core", "qwen_gdn_attention_core_fused_norm_packed")


@dataclass(frozen=True)
class Dims:
    """A GDN layer under its config.json names (plan/families/gdn.py's ``GdnSpec``), and how the server runs it."""

    hidden_size: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    layout: str
    dtype: str
    mamba_ssm_cache_dtype: str = "auto"
    num_speculative_tokens: int = 0
    tp: int = 1
    prefill_backend: str = "auto"
    num_key_value_heads: int = 0  # the attention layers', for the page the GDN state is padded to (0: none)
    head_dim: int = 0
    attention_backend: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    max_model_len: int = 8192


def gdn(*, hidden_size: int, linear_num_key_heads: int, linear_num_value_heads: int, linear_key_head_dim: int,
        linear_value_head_dim: int, linear_conv_kernel_dim: int, dtype: str, max_num_seqs: int,
        max_num_batched_tokens: int, layout: str = "flat", mamba_ssm_cache_dtype: str = "auto",
        num_speculative_tokens: int = 0, tensor_parallel_size: int = 1, gdn_prefill_backend: str = "auto",
        num_key_value_heads: int = 0, head_dim: int = 0, attention_backend: str = "auto",
        kv_cache_dtype: str = "auto", block_size: int = 16, max_model_len: int = 8192,
        entries: list[str] | None = None) -> dict:
    """Run the layer over every batch of ``sweep``; returns what ran, compiled and was faked.

    Arguments are Qwen3-Next's config.json names plus the serving flags they meet (``--num-speculative-tokens``,
    ``--gdn-prefill-backend``, ``--mamba-ssm-cache-dtype``, ``--attention-backend``, ``--kv-cache-dtype``,
    ``--block-size``, ``--max-model-len``). ``layout``: ``interleaved`` (Qwen3-Next) or ``flat`` (Qwen3.5).
    ``entries``: ``profile``, ``decode``, ``prefill``, ``mixed`` (default all four, in that order). TP ``t`` is
    built as rank 0 of ``t``.
    """
    started = time.perf_counter()
    entries = list(entries) if entries else list(ENTRIES)
    dims = Dims(hidden_size, linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
                linear_conv_kernel_dim, layout, dtype, mamba_ssm_cache_dtype, num_speculative_tokens,
                tensor_parallel_size, gdn_prefill_backend, num_key_value_heads, head_dim, attention_backend,
                kv_cache_dtype, block_size, max_model_len)
    check_arguments(dims, entries)
    substitutions = prepare()
    require_triton()
    tuner = FlaAutotuneCandidates(uninitialised_configs(substitutions["device_queries"])) if cross() else None
    with tensor_parallel(dims.tp, TP_USERS), device_scope(), real_host(), device_zero(), \
            (tuner or contextlib.nullcontext()):
        layer = make_layer(dims, max_num_seqs, max_num_batched_tokens)
        calls = drive(layer, entries, lambda e: sweep(e, max_num_seqs, max_num_batched_tokens, num_speculative_tokens),
                      forward, profile)
    return summary(describe(layer), entries, calls, substitutions, tuner, started)


def check_arguments(dims: Dims, entries: list[str]) -> None:
    """Refuse what the layer cannot be built for, before anything is imported."""
    choices = (("dtype", dims.dtype, DTYPES), ("mamba_ssm_cache_dtype", dims.mamba_ssm_cache_dtype, STATE_DTYPES),
               ("layout", dims.layout, LAYOUTS), ("gdn_prefill_backend", dims.prefill_backend, PREFILL_BACKENDS),
               ("attention_backend", dims.attention_backend, ATTENTION_BACKENDS),
               ("kv_cache_dtype", dims.kv_cache_dtype, KV_CACHE_DTYPES))
    for name, value, allowed in choices:
        if value not in allowed:
            raise ValueError(f"gdn: {name} must be one of {allowed}, got {value!r}")
    if dims.tp < 1 or dims.linear_num_key_heads % dims.tp or dims.linear_num_value_heads % dims.tp:
        raise ValueError(f"gdn: TP {dims.tp} must divide linear_num_key_heads {dims.linear_num_key_heads} and "
                         f"linear_num_value_heads {dims.linear_num_value_heads}")
    if dims.linear_num_value_heads % dims.linear_num_key_heads:
        raise ValueError(f"gdn: linear_num_key_heads {dims.linear_num_key_heads} must divide "
                         f"linear_num_value_heads {dims.linear_num_value_heads}")
    if dims.num_speculative_tokens < 0:
        raise ValueError(f"gdn: num_speculative_tokens must be >= 0, got {dims.num_speculative_tokens}")
    if set(entries) - set(ENTRIES):
        raise ValueError(f"gdn: entries must be among {sorted(ENTRIES)}, got {entries}")


# -- what the layer meets besides its Triton kernels --------------------------------------------------------------


def prepare() -> dict:
    """Import shims and C ops (exercise/fake_ops.py), in cross mode the platform's answers and the CUDA MTP op;
    then vLLM's FLA and GDN modules, imported with torch's CUDA queries answering as the target (cross mode), or
    natively with CUDA initialised first (``initialise_cuda``)."""
    if not cross():
        initialise_cuda()
    import vllm._custom_ops  # noqa: F401 -- loads vLLM's compiled ops where they are installed

    from . import fake_ops

    done = fake_ops.install()
    done["ops"] += layers.install_ops(fake_ops)
    if cross():
        done["ops"] += install_mtp_op(fake_ops)
    done["platform"] = platform_like_cuda() if cross() else []
    done["device_queries"] = import_fla()
    done["calls"] = ([{"call": f"torch.ops.vllm.{op}", "by": f"qwen_gdn_linear_attn.{op}",
                       "why": "under FakeTensorMode the custom op runs its fake impl, which launches no kernel"}
                      for op in CORE_OPS] if cross() else [])
    return done


def fused_gdn_decode_post_conv_mtp(*args: Any, **kwargs: Any) -> None:
    """vLLM's CUDA MTP decode kernel (csrc): not run here; the build never executes it on real tensors."""
    raise NotImplementedError("kernelcache: _C::fused_gdn_decode_post_conv_mtp is a CUDA kernel; no substitute")


def install_mtp_op(fake_ops: Any) -> list[dict]:
    """``_C::fused_gdn_decode_post_conv_mtp`` where vLLM's compiled ops are absent: whether it exists decides
    ``supports_fused_mtp_decode()``, hence Qwen3.5's path with drafts; it launches no Triton kernel."""
    spec = fake_ops.OpSpec(
        "_C", "fused_gdn_decode_post_conv_mtp",
        "fused_gdn_decode_post_conv_mtp(Tensor mixed_qkv, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, "
        "Tensor state_indices, Tensor cu_seqlens, Tensor num_accepted_tokens, Tensor(a!) state, "
        "Tensor output_gate, Tensor norm_weight, Tensor(b!) out, float scale, float norm_eps, "
        "str output_gate_activation) -> ()",
        "csrc/torch_bindings.cpp; vllm/_custom_ops.py fused_gdn_decode_post_conv_mtp, called by "
        "QwenGatedDeltaNetAttention._forward_core_decode_spec_post_conv_fused_norm",
        fused_gdn_decode_post_conv_mtp, fake_ops._keep_buffers)
    if fake_ops._present(spec):
        return []
    fake_ops._register(spec)
    return [{"op": spec.qualname, "upstream": spec.upstream, "fake": True, "torch": None}]


def platform_like_cuda() -> list[dict]:
    """The build's platform answers as vLLM's ``CudaPlatformBase`` does for what the GDN path asks."""
    from vllm.platforms import current_platform

    done = layers.pdl_like_cuda()
    platform = type(current_platform)
    if platform.__name__ != "CudaPlatform" and "get_cuda_runtime_major" not in vars(platform):
        platform.get_cuda_runtime_major = classmethod(lambda cls: cuda_runtime_major())
        done.append({"platform": f"{platform.__name__}.get_cuda_runtime_major",
                     "as": "CudaPlatformBase.get_cuda_runtime_major (torch.version.cuda's major)",
                     "why": "_resolve_gdn_prefill_backend asks it on Blackwell"})
    return done


def cuda_runtime_major() -> int:
    """vllm/platforms/cuda.py ``CudaPlatformBase.get_cuda_runtime_major``: the major of ``torch.version.cuda``, or 0
    (that module needs vLLM's compiled extension to import, so it is not imported here)."""
    import torch

    major = (torch.version.cuda or "0").split(".", 1)[0]
    return int(major) if major.isdigit() else 0


def initialise_cuda() -> None:
    """Natively: CUDA is initialised before FLA's modules import, as in vLLM's GPU worker (``Worker.init_device``
    sets the device before ``load_model`` imports the model's modules). FLA's import-time ``check_shared_mem()``
    asks Triton's driver (``get_device_properties``) for the device's shared memory, which fails before
    ``cuInit``, and FLA takes the failure for a small device: ``chunk_fwd_kernel_o``'s block sizes follow."""
    import torch

    torch.cuda.init()


def import_fla() -> dict:
    """Import FLA's ops and the GDN layer (their device checks run at import); returns what those checks saw and,
    in cross mode, whether FLA's import initialises CUDA itself (``import_initialises_cuda``)."""
    import importlib

    with cuda_answers():
        utils = importlib.import_module(f"{FLA}.utils")
        for name in FLA_MODULES:
            importlib.import_module(f"{FLA}.{name}")
        importlib.import_module(GDN_MODULE)
    return {"is_nvidia_hopper": bool(utils.is_nvidia_hopper), "check_shared_mem": bool(utils.check_shared_mem()),
            "is_tma_supported": bool(utils.is_tma_supported), "answered": cross(),
            "initialises_cuda": import_initialises_cuda() if cross() else None}


# torch's CUDA queries that initialise CUDA on a GPU (torch.cuda.device_count asks NVML first, and does not)
INITIALISING = ("get_device_name", "get_device_capability")


def import_initialises_cuda() -> bool:
    """Cross mode: whether FLA's ops/utils.py initialises CUDA as it imports, by asking torch's device queries
    (vLLM 0.33's ``is_nvidia_hopper``), or asks vLLM's NVML platform alone (0.34), so that a process importing
    FLA before CUDA is initialised gets ``check_shared_mem() == False``. A fresh copy of the module runs, so the
    answer does not depend on what imported FLA first."""
    import importlib
    import importlib.util

    utils = importlib.import_module(f"{FLA}.utils")
    spec = importlib.util.spec_from_file_location(utils.__name__, utils.__file__)
    asked: list[str] = []
    with cuda_answers(asked):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return any(query in INITIALISING for query in asked)


def uninitialised_configs(device_queries: dict) -> dict[str, list]:
    """Cross mode, where FLA's import leaves CUDA uninitialised: per autotuned FLA kernel whose candidates follow
    ``check_shared_mem()`` (``chunk_fwd_kernel_o``'s ``BKV_LIST``, cumsum's ``BS_LIST``), its configs as its
    module makes them when that answers False. A server process that imports the model's modules before CUDA is
    up (or is forked from one that did) autotunes over these; one that imports them after, over the target's.
    Each module runs again from its file with ``check_shared_mem`` answering False; the copies are not kept."""
    if device_queries.get("initialises_cuda", True):
        return {}
    import importlib
    import importlib.util

    utils = importlib.import_module(f"{FLA}.utils")
    found: dict[str, list] = {}
    saved = utils.check_shared_mem
    utils.check_shared_mem = lambda *args, **kwargs: False
    try:
        with cuda_answers():
            for name in FLA_MODULES:
                module = importlib.import_module(f"{FLA}.{name}")
                if "check_shared_mem" not in vars(module):
                    continue
                spec = importlib.util.spec_from_file_location(module.__name__, module.__file__)
                copy = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(copy)
                found.update({kernel.base_fn.__name__: list(kernel.configs) for kernel in autotuners(copy)})
    finally:
        utils.check_shared_mem = saved
    return found


@contextlib.contextmanager
def cuda_answers(asked: list[str] | None = None):
    """Cross mode: torch's CUDA queries answer as the target does (device 0's name and capability, one device),
    while FLA's modules run their import-time device checks; nothing else sees them. ``asked`` collects the
    queries' names as they are asked."""
    if not cross():
        yield
        return
    import torch
    from vllm.platforms import current_platform

    name = current_platform.get_device_name()
    capability = current_platform.get_device_capability()
    values = {"get_device_name": name, "get_device_capability": (capability.major, capability.minor),
              "device_count": 1}
    saved = {attr: getattr(torch.cuda, attr) for attr in values}
    for attr, value in values.items():
        setattr(torch.cuda, attr, answer(attr, value, asked))
    try:
        yield
    finally:
        for attr, value in saved.items():
            setattr(torch.cuda, attr, value)


def answer(query: str, value: Any, asked: list[str] | None) -> Any:
    """A stand-in for ``torch.cuda.<query>`` returning ``value`` and noting the query in ``asked``."""

    def answered(*args: Any, **kwargs: Any) -> Any:
        if asked is not None:
            asked.append(query)
        return value

    return answered


@contextlib.contextmanager
def device_zero():
    """Cross mode: ``torch.cuda.current_device()`` is 0, as on a one-GPU server (the layer places its norm's
    weight on ``current_platform.current_device()``); torch would need a driver to say so."""
    if not cross():
        yield
        return
    import torch

    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0
    try:
        yield
    finally:
        torch.cuda.current_device = saved


# -- the layer, its state and its metadata builder ----------------------------------------------------------------


@dataclass
class ModelConfigView:
    """What the GDN layer, its metadata builder and the attention backend's block-size choice read from
    ``ModelConfig``: the dtype, the text config (the prefill backend's choice reads its head dims), the served
    length and the attention head size."""

    dtype: Any
    hf_text_config: Any
    max_model_len: int
    head_size: int = 0
    num_kv_heads: int = 0
    is_diffusion: bool = False

    def get_head_size(self) -> int:
        return self.head_size

    def get_num_kv_heads(self, parallel_config: Any) -> int:
        return max(1, self.num_kv_heads // parallel_config.tensor_parallel_size)


@dataclass
class SpeculativeView:
    """What the GDN layer and builder read from ``SpeculativeConfig``."""

    num_speculative_tokens: int
    method: str = "mtp"  # Qwen3-Next's and Qwen3.5's own draft layers (any method gives the GDN layer drafts)
    parallel_drafting: bool = False  # MTP drafts one token per step

    def use_eagle_block_drop(self) -> bool:
        """Read by ``MambaPrefillCheckpointBuilder``; it drops a prefix-cache block only in ``align`` mode, and
        the task serves ``none`` mode."""
        return False


@dataclass
class GdnLayer:
    """One ``QwenGatedDeltaNetAttention`` as the model builds it, its bound state, and the runner's builder."""

    attn: Any
    builder: Any  # GDNAttentionMetadataBuilder
    vllm_config: Any
    dims: Dims
    max_num_seqs: int
    block_table: Any  # [max_num_seqs, 1 + drafts] int32, as MRV2's BlockTables hold a "none"-mode Mamba group
    page_bytes: int


def text_config(dims: Dims) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(hidden_size=dims.hidden_size, hidden_act="silu", rms_norm_eps=1e-6,
                           linear_num_key_heads=dims.linear_num_key_heads,
                           linear_num_value_heads=dims.linear_num_value_heads,
                           linear_key_head_dim=dims.linear_key_head_dim,
                           linear_value_head_dim=dims.linear_value_head_dim,
                           linear_conv_kernel_dim=dims.linear_conv_kernel_dim)


def vllm_config(dims: Dims, max_num_seqs: int, max_num_batched_tokens: int) -> Any:
    """A ``VllmConfig`` as the server resolves it for a hybrid GDN model: prefix caching off (``none`` mode, Mamba
    blocks of ``max_model_len``), FULL_AND_PIECEWISE CUDA graphs, the SSM state dtype, the prefill backend and the
    drafts."""
    import torch
    from vllm.config import CUDAGraphMode, VllmConfig

    config = VllmConfig()
    config.scheduler_config.max_num_seqs = max_num_seqs
    config.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    config.cache_config.enable_prefix_caching = False
    config.cache_config.mamba_cache_mode = "none"
    config.cache_config.mamba_ssm_cache_dtype = dims.mamba_ssm_cache_dtype
    config.cache_config.mamba_block_size = dims.max_model_len
    config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    if dims.prefill_backend != "auto":
        config.additional_config = {"gdn_prefill_backend": dims.prefill_backend}
    model = ModelConfigView(getattr(torch, dims.dtype), text_config(dims), dims.max_model_len, dims.head_dim,
                            dims.num_key_value_heads)
    object.__setattr__(config, "model_config", model)
    if dims.num_speculative_tokens:
        object.__setattr__(config, "speculative_config", SpeculativeView(dims.num_speculative_tokens))
    return config


def make_layer(dims: Dims, max_num_seqs: int, max_num_batched_tokens: int) -> GdnLayer:
    """``QwenGatedDeltaNetAttention`` as the model file builds it, its state bound in pages padded as the server
    pads them, and the metadata builder; on ``cuda``."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    config = vllm_config(dims, max_num_seqs, max_num_batched_tokens)
    with served_flash_attn_version():
        backend = attention_backend_class(dims)
    with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype), torch.device("cuda"):
        attn = QwenGatedDeltaNetAttention(text_config(dims), config, prefix=LAYER_NAME,
                                          gqa_interleaved_layout=dims.layout == "interleaved")
        fill_parameters(attn)
        config.cache_config.mamba_page_size_padded = padded_page(attn, dims, config, backend)
        spec = attn.get_kv_cache_spec(config)
        pages = torch.zeros((max_num_seqs + 1) * spec.page_size_bytes, dtype=torch.int8, device="cuda")
        attn.bind_kv_cache(pages.view(max_num_seqs + 1, 1, 1, spec.page_size_bytes))
        builder = GDNAttentionMetadataBuilder(spec, [LAYER_NAME], config, torch.device("cuda"))
        table = torch.empty((max_num_seqs, 1 + dims.num_speculative_tokens), dtype=torch.int32, device="cuda")
    return GdnLayer(attn, builder, config, dims, max_num_seqs, table, spec.page_size_bytes)


def fill_parameters(attn: Any) -> None:
    """Native mode: seeded weights (``A_log`` and ``dt_bias`` small, as trained checkpoints have them)."""
    import torch

    if cross():
        return
    generator = torch.Generator(device="cuda").manual_seed(1234)
    with torch.no_grad():
        for param in attn.parameters():
            fan_in = param.shape[-1] if param.dim() > 1 else 1
            param.copy_(torch.randn(param.shape, generator=generator, device="cuda") / fan_in**0.5)
        attn.A_log.copy_(torch.rand(attn.A_log.shape, generator=generator, device="cuda") - 0.5)
        attn.dt_bias.copy_(torch.rand(attn.dt_bias.shape, generator=generator, device="cuda") - 2.0)
        attn.norm.weight.fill_(1.0)


def attention_backend_class(dims: Dims) -> Any:
    """The full-attention layers' backend: the plan's, else vLLM's pick on NVIDIA GPUs (FLASH_ATTN up to Hopper,
    FLASHINFER on Blackwell, vllm/platforms/cuda.py ``_get_backend_priorities``)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    name = dims.attention_backend
    if name == "auto":
        name = "FLASHINFER" if current_platform.get_device_capability().major >= 10 else "FLASH_ATTN"
    return AttentionBackendEnum[name].get_class()


@contextlib.contextmanager
def served_flash_attn_version():
    """Cross mode: FlashAttention's version is the one vLLM picks by default on the target with its own FA builds
    (``fa_utils.get_flash_attn_version``: FA3 on Hopper, FA4 on Blackwell, FA2 otherwise), not what loads on the
    build machine; it decides FlashAttention's kernel block sizes (FA4's head-256 and fp8 pages)."""
    if not cross():
        yield
        return
    from vllm.platforms import current_platform

    with answering_flash_attn_version(fa_version(current_platform.get_device_capability().major)):
        yield


def padded_page(attn: Any, dims: Dims, config: Any, backend: Any) -> int | None:
    """The page the server gives each GDN block: ``Platform._align_hybrid_block_size`` makes the attention block
    the smallest multiple of the kernel block alignment whose page holds the GDN state, and pads the GDN page to
    that attention page (None: no attention layers given, or the pages already match)."""
    if not dims.num_key_value_heads or not dims.head_dim:
        return None
    from vllm.config import set_current_vllm_config
    from vllm.utils.math_utils import cdiv
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    unpadded = attn.get_kv_cache_spec(config).page_size_bytes
    kv_heads = max(1, dims.num_key_value_heads // dims.tp)  # ModelConfig.get_num_kv_heads
    cache = dims.kv_cache_dtype
    kv_dtype = config.model_config.dtype if cache == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cache]
    with set_current_vllm_config(config), served_flash_attn_version():
        per_token = backend.customize_spec(FullAttentionSpec(
            block_size=1, num_kv_heads=kv_heads, head_size=dims.head_dim, dtype=kv_dtype,
            kv_quant_mode=get_kv_quant_mode(cache))).page_size_bytes
        block = backend.get_preferred_block_size(dims.block_size)
        smallest = min(s.base if isinstance(s, MultipleOf) else s for s in backend.get_supported_kernel_block_sizes())
    alignment = max(smallest, block)
    page = alignment * cdiv(unpadded, alignment * per_token) * per_token
    return None if page == unpadded else page


# -- batches ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """One step: each request's (new tokens, tokens already in its state, drafts), decodes first; ``drafts`` is
    the row's draft count when it is a spec-decode row (its new tokens are 1 + drafts), else -1."""

    requests: tuple[tuple[int, int, int], ...]

    @property
    def num_tokens(self) -> int:
        return sum(q for q, _, _ in self.requests)

    @property
    def spec(self) -> bool:
        return any(d >= 0 for _, _, d in self.requests)


def sweep(entry: str, max_num_seqs: int, max_tokens: int, drafts: int = 0) -> list[Batch]:
    """The batches of one entry (module docstring); with drafts every decode row is a spec-decode row."""
    return [b for b in SWEEP[entry](max_num_seqs, max_tokens, drafts) if b.num_tokens <= max_tokens]


def decode_rows(count: int, drafts: int, short: int = 0) -> tuple[tuple[int, int, int], ...]:
    """``count`` decode rows; with drafts each row 1 + drafts tokens, the last ``short`` rows with none."""
    if not drafts:
        return ((1, CONTEXT, -1),) * count
    return ((1 + drafts, CONTEXT, drafts),) * (count - short) + ((1, CONTEXT, 0),) * short


def decode_batches(max_num_seqs: int, max_tokens: int, drafts: int) -> list[Batch]:
    """Decode-only batches of every size; with drafts also rows that drafted nothing (their drafter proposed none)
    beside full ones, and batches of one-token prompt chunks alone, which are not spec-decode rows and take the
    plain decode kernels on a state with the drafts' rows."""
    batches = [Batch(decode_rows(b, drafts)) for b in range(1, max_num_seqs + 1)]
    if drafts:
        batches += [Batch(decode_rows(b, drafts, short)) for b in sorted({1, 2, 3, 16, 17, max_num_seqs})
                    for short in sorted({1, b}) if short <= b <= max_num_seqs]
        batches += [Batch(((1, CONTEXT, -1),) * b) for b in range(1, max_num_seqs + 1)]
    return batches


def prefill_lengths(max_tokens: int) -> list[int]:
    """Lengths reaching each ``== 1`` / ``% 16`` class of the token count and of the chunk count."""
    small = set(range(1, 34)) | {CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 1, 16 * CHUNK, 16 * CHUNK + 1,
                                 17 * CHUNK, max_tokens, max_tokens - 1}
    return sorted(n for n in small if 1 <= n <= max_tokens)


def prefill_batches(max_num_seqs: int, max_tokens: int, drafts: int) -> list[Batch]:
    """Single prompts (fresh, and continuing a chunked prefill), then several prompts."""
    batches = [Batch(((n, 0, -1),)) for n in prefill_lengths(max_tokens)]
    batches += [Batch(((n, CONTEXT, -1),)) for n in prefill_lengths(max_tokens)]
    for count in sorted({2, 3, 16, 17, max_num_seqs}):
        if 2 * count <= max_tokens and count <= max_num_seqs:
            batches.append(Batch(((1, 0, -1),) * count))  # one-token prompts: every sequence one token long
            batches.append(Batch(((2, 0, -1),) * count))
            batches.append(Batch(((max_tokens // count, CONTEXT, -1),) * count))
    return batches


def mixed_batches(max_num_seqs: int, max_tokens: int, drafts: int) -> list[Batch]:
    """Decodes followed by one prefill (fresh or continuing): decode counts of every residue mod 8 (the prefill
    rows' gating inputs start that many rows in), prompts of each class."""
    batches = []
    for decodes in sorted(set(range(1, 10)) | {15, 16, 17, max_num_seqs - 1}):
        if not 1 <= decodes < max_num_seqs:
            continue
        rows = decode_rows(decodes, drafts)
        used = sum(q for q, _, _ in rows)
        for prompt in sorted({1, 2, 17, CHUNK + 1, max_tokens - used}):
            if 1 <= prompt <= max_tokens - used:
                batches.append(Batch(rows + ((prompt, 0, -1),)))
                batches.append(Batch(rows + ((prompt, CONTEXT, -1),)))
    return batches


def profile_batches(max_num_seqs: int, max_tokens: int, drafts: int) -> list[Batch]:
    """The engine's profile run: one step of ``max_num_batched_tokens`` dummy tokens, run by ``profile``."""
    return [Batch(((max_tokens, 0, -1),))]


SWEEP = {"profile": profile_batches, "decode": decode_batches, "prefill": prefill_batches, "mixed": mixed_batches}
ENTRIES = tuple(SWEEP)


def is_prefilling(layer: GdnLayer, batch: Batch) -> list[bool]:
    """MRV2's ``is_prefilling`` per row: a prompt chunk (with drafts, every row that is not a spec-decode row)."""
    spec = layer.dims.num_speculative_tokens > 0
    return [d < 0 and (spec or q > 1 or c == 0) for q, c, d in batch.requests]


def common_metadata(layer: GdnLayer, batch: Batch) -> Any:
    """The step's ``CommonAttentionMetadata`` as MRV2's ``build_attn_metadata`` fills it."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    query = [q for q, _, _ in batch.requests]
    seq_lens = [q + c for q, c, _ in batch.requests]
    starts = torch.tensor([0, *query], dtype=torch.int32).cumsum(0).to(torch.int32)
    num_reqs, num_tokens = len(query), batch.num_tokens
    return CommonAttentionMetadata(
        query_start_loc=torch.empty(num_reqs + 1, dtype=torch.int32, device="cuda").copy_(starts),
        query_start_loc_cpu=starts, seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=num_reqs,
        num_actual_tokens=num_tokens, max_query_len=max(query), max_seq_len=max(seq_lens),
        block_table_tensor=layer.block_table[:num_reqs],
        slot_mapping=torch.zeros(num_tokens, dtype=torch.int64, device="cuda"),
        is_prefilling=torch.tensor(is_prefilling(layer, batch)))


def draft_metadata(layer: GdnLayer, batch: Batch) -> dict:
    """With drafts: ``num_accepted_tokens`` (a fresh int32 tensor of one per row, then the accepted counts) and
    ``num_decode_draft_tokens_cpu`` (drafts per spec-decode row, -1 for the others), as
    ``MambaHybridModelState.prepare_attn`` passes them."""
    import torch

    if not layer.dims.num_speculative_tokens:
        return {}
    rows = len(batch.requests)
    accepted = torch.ones(rows, dtype=torch.int32, device="cuda")
    drafts = torch.tensor([d for _, _, d in batch.requests], dtype=torch.int32)
    return {"num_accepted_tokens": accepted, "num_decode_draft_tokens_cpu": drafts}


def fill_block_table(layer: GdnLayer, batch: Batch) -> None:
    """Request ``i`` owns state block ``i + 1`` (block 0 is vLLM's null block); its draft columns the same."""
    import torch

    if not cross():
        rows = torch.arange(1, len(batch.requests) + 1, dtype=torch.int32, device="cuda")
        layer.block_table[: len(batch.requests)] = rows[:, None]


def forward(layer: GdnLayer, batch: Batch, hidden: Any) -> Any:
    """One step: the builder's metadata, then ``QwenGatedDeltaNetAttention.forward`` under the forward context."""
    fill_block_table(layer, batch)
    metadata = layer.builder.build(0, common_metadata(layer, batch), **draft_metadata(layer, batch))
    return step(layer, {LAYER_NAME: metadata}, batch.num_tokens, hidden)


def step(layer: GdnLayer, metadata: dict | None, num_tokens: int, hidden: Any) -> Any:
    """``QwenGatedDeltaNetAttention.forward`` under the forward context holding ``metadata`` (None: the profile
    run's)."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    with set_current_vllm_config(layer.vllm_config), \
            set_forward_context(metadata, layer.vllm_config, num_tokens=num_tokens), \
            python_bodies(GDN_MODULE, CORE_OPS), flashinfer_prefill_shapes(layer):
        return layer.attn.forward(hidden)


def profile(layer: GdnLayer, batch: Batch, hidden: Any) -> Any:
    """The profile run's step: the layer's forward with no attention metadata (the runner's ``_dummy_run`` for
    ``profile_run``), which warms the prefill kernels (``_warmup_prefill_kernels``); a warmup failure raises."""
    with warmup_failures(GDN_MODULE):
        return step(layer, None, batch.num_tokens, hidden)


def empty_flashinfer_prefill(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any, output_final_state: bool,
                             cu_seqlens: Any = None, **_: Any) -> tuple[Any, Any]:
    """``fi_chunk_gated_delta_rule``'s outputs, empty: ``[1, T, HV, V]`` in the inputs' dtype and the fp32 final
    states ``[N, HV, V, K]``. FlashInfer's GDN prefill is a CUDA module, no Triton kernel."""
    import torch

    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    state = torch.empty(initial_state.shape, dtype=torch.float32, device=q.device) if output_final_state else None
    return out, state


@contextlib.contextmanager
def flashinfer_prefill_shapes(layer: GdnLayer):
    """Cross mode with FlashInfer's prefill: ``fi_chunk_gated_delta_rule`` returns empty outputs of its shapes."""
    if not cross() or layer.attn.gdn_prefill_backend != "flashinfer":
        yield
        return
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn

    saved = qwen_gdn_linear_attn.fi_chunk_gated_delta_rule
    qwen_gdn_linear_attn.fi_chunk_gated_delta_rule = empty_flashinfer_prefill
    try:
        yield
    finally:
        qwen_gdn_linear_attn.fi_chunk_gated_delta_rule = saved


# -- autotuned kernels --------------------------------------------------------------------------------------------


class FlaAutotuneCandidates(AutotuneCandidates):
    """Cross mode: every launch of an autotuned FLA kernel compiles all its candidates (exercise/layers.py), and
    those of ``extra`` (``uninitialised_configs``) beside them."""

    def __init__(self, extra: dict[str, list] | None = None) -> None:
        super().__init__(tuple(f"{FLA}.{name}" for name in FLA_MODULES))
        self.extra = extra or {}
        self.added: dict[str, int] = {}

    def __enter__(self) -> FlaAutotuneCandidates:
        super().__enter__()
        for name, kernel in self.kernels.items():
            self._add(kernel, self.extra.get(name, ()))
        return self

    def _add(self, kernel: Any, configs: Any) -> None:
        """Append the configs of ``configs`` the kernel's own list lacks (restored on exit)."""
        known = {config_label(c) for c in kernel.configs}
        more = [c for c in configs if config_label(c) not in known]
        if more:
            self.saved.append((kernel, "configs", kernel.configs))
            kernel.configs = [*kernel.configs, *more]
            self.added[kernel.base_fn.__name__] = len(more)

    def summary(self) -> dict:
        """``AutotuneCandidates.summary``, each kernel's configs counting those added, and how many were."""
        found = super().summary()
        for name, count in self.added.items():
            found[name] = {**found[name], "configs": found[name]["configs"] + count,
                           "added_for_uninitialised_cuda": count}
        return found


# -- summary ------------------------------------------------------------------------------------------------------


def describe(layer: GdnLayer) -> dict:
    """What vLLM chose for this layer: prefill backend, decode kernels, state layout and dtypes, page."""
    attn = layer.attn
    conv_state, ssm_state = attn.kv_cache[:2]
    return {"entry": "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn.QwenGatedDeltaNetAttention.forward",
            "layout": layer.dims.layout, "prefill_backend": attn.gdn_prefill_backend,
            "decode_kernel": attn.gdn_decode_kernel, "packed_decode": bool(attn.enable_packed_recurrent_decode),
            "fused_mtp_decode": bool(attn.enable_fused_gdn_spec_decode),
            "norm": "forward_native (torch; Inductor in the server)" if not norm_enabled(layer)
            else "rmsnorm_fn (Triton)", "conv_state": tensor(conv_state), "ssm_state": tensor(ssm_state),
            "page_bytes": layer.page_bytes, "num_speculative_tokens": layer.dims.num_speculative_tokens,
            "dtype": layer.dims.dtype, "tensor_parallel_size": layer.dims.tp, "max_num_seqs": layer.max_num_seqs}


def tensor(t: Any) -> dict:
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).removeprefix("torch.")}


def norm_enabled(layer: GdnLayer) -> bool:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(layer.vllm_config):
        return bool(layer.attn.norm.enabled())
