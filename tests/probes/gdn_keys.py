"""Independent probe: the Triton keys vLLM 0.33's gated-delta-net layer (Qwen3-Next / Qwen3.5) asks for under the
fake target, every candidate config of the autotuned FLA kernels included.

Written without kernelcache's GDN exercise code (only its fake driver, fake CUDA tensors and the import shims of
exercise/fake_ops.py, "the same fake target"): its own CUDA platform (the probes' minimal one plus the capability,
device name and the answers vLLM's CUDA platform gives), torch's device queries patched with ``unittest.mock`` while
FLA imports, the layer built from a transformers ``Qwen3NextConfig`` the way models/qwen3_next.py and qwen3_5.py
build it, the GDN page padded by its own arithmetic (attention page per token = 2 x KV heads x head dim x 2 bytes,
blocks a multiple of 16 tokens), its own state buffer, metadata built by vLLM's ``GDNAttentionMetadataBuilder``
from its own ``CommonAttentionMetadata`` (with drafts: every decode row a spec-decode row), and a seeded random sweep
of batch compositions (decodes, fresh and continued prefills, mixes) within the limits.

Autotuning as in mamba_keys.py: an equal benchmarker that calls each candidate once, every autotune cache dropped
before each launch, ``TRITON_CACHE_AUTOTUNING=0``. The layer's custom ops get their Python bodies as fake
implementations (under the fake CUDA's eager-layout mode, as the server's eager ops lay their outputs out), so they
run under the fake mode; FlashInfer's prefill (a CUDA module) returns empty outputs.

Prints one JSON line per compile() call, {"entry", "name", "key", "hit"}, then one per candidate config the
autotuner benchmarked, {"candidate": kernel name, "config": its meta-parameters, num_warps, num_stages as JSON}.

    python gdn_keys.py CAPABILITY SM_COUNT PRODUCT CONFIG_JSON MAX_NUM_SEQS MAX_NUM_BATCHED_TOKENS ROUNDS [KIND]

CONFIG_JSON: hidden_size, linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
linear_conv_kernel_dim, num_key_value_heads, head_dim, dtype, layout (interleaved or flat), mamba_ssm_cache_dtype,
num_speculative_tokens, gdn_prefill_backend (triton or flashinfer), max_model_len. KIND: profile (the engine's
profile run, once), decode, prefill, mixed (default: all).
"""

import json
import math
import os
import random
import sys
from types import SimpleNamespace
from unittest import mock

import probe_target  # this folder: the fake target, a CUDA platform, the compile log

capability, sm_count, product = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cfg = json.loads(sys.argv[4])
max_seqs, max_tokens, rounds = map(int, sys.argv[5:8])
only = sys.argv[8] if len(sys.argv) > 8 else None
drafts = cfg["num_speculative_tokens"]
os.environ["TRITON_CACHE_AUTOTUNING"] = "0"  # before vLLM's env_override sets its default of 1
events = probe_target.start(capability, sm_count)

import torch  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402


class GdnProbeCuda(type(vllm.platforms._current_platform)):
    @classmethod
    def get_device_capability(cls, device_id=0):
        return DeviceCapability(capability // 10, capability % 10)

    @classmethod
    def get_device_name(cls, device_id=0):
        return product

    @classmethod
    def is_arch_support_pdl(cls):
        return capability >= 90

    @classmethod
    def get_cuda_runtime_major(cls):
        return int(torch.version.cuda.split(".")[0])


vllm.platforms._current_platform = GdnProbeCuda()
import vllm._custom_ops  # noqa: E402, F401

from kernelcache.exercise import fake_ops  # noqa: E402
from kernelcache.exercise.fake_device import fake_cuda  # noqa: E402

fake_ops.install()
_lib = torch.library.Library("_C", "FRAGMENT")
if not hasattr(torch.ops._C, "cutlass_scaled_mm_supports_fp8"):  # quantization/online/fp8.py, at import
    _lib.define("cutlass_scaled_mm_supports_fp8(int cuda_device_capability) -> bool")
    _lib.impl("cutlass_scaled_mm_supports_fp8", lambda c: c >= 89, "CompositeExplicitAutograd")
if not hasattr(torch.ops._C, "fused_gdn_decode_post_conv_mtp"):  # the server has vLLM's compiled ops
    _lib.define("fused_gdn_decode_post_conv_mtp(Tensor a0, Tensor a1, Tensor a2, Tensor a3, Tensor a4, Tensor a5, "
                "Tensor a6, Tensor a7, Tensor(a!) a8, Tensor a9, Tensor a10, Tensor(b!) a11, float a12, float a13, "
                "str a14) -> ()")
    torch.library.register_fake("_C::fused_gdn_decode_post_conv_mtp", lambda *args: None, lib=_lib)

queries = {"get_device_name": lambda *a: product, "get_device_capability": lambda *a: divmod(capability, 10),
           "device_count": lambda: 1}
with mock.patch.multiple(torch.cuda, **queries):
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn_module

from transformers import Qwen3NextConfig  # noqa: E402
from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.utils.torch_utils import set_default_torch_dtype  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder  # noqa: E402

rng = random.Random(20261207)
PREFIX = "model.layers.1.linear_attn"
dtype = getattr(torch, cfg["dtype"])


configs_seen = probe_target.every_candidate()


def body_with_eager_layouts(op):
    """The op's Python body as its fake implementation, run under the fake CUDA's eager-layout mode again: a fake
    implementation runs inside that mode's dispatch, where the mode is off, and its ops would otherwise get the meta
    functions' layouts (a size-1 dim's stride), not eager CUDA's."""
    body = getattr(gdn_module, op)

    def fake(*args, **kwargs):
        with eager:
            return body(*args, **kwargs)

    return fake




def flashinfer_prefill(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None, **kwargs):
    return torch.empty_like(v), torch.empty(initial_state.shape, dtype=torch.float32, device=v.device)


gdn_module.fi_chunk_gated_delta_rule = flashinfer_prefill


def hf_config():
    names = ("hidden_size", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
             "linear_value_head_dim", "linear_conv_kernel_dim", "num_key_value_heads", "head_dim")
    return Qwen3NextConfig(**{k: cfg[k] for k in names}, hidden_act="silu", rms_norm_eps=1e-6)


def config_for(hf):
    vc = VllmConfig()
    vc.scheduler_config.max_num_seqs = max_seqs
    vc.scheduler_config.max_num_batched_tokens = max_tokens
    vc.cache_config.enable_prefix_caching = False
    vc.cache_config.mamba_cache_mode = "none"
    vc.cache_config.mamba_ssm_cache_dtype = cfg["mamba_ssm_cache_dtype"]
    vc.cache_config.mamba_block_size = cfg["max_model_len"]
    vc.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE  # MambaModelConfig's default
    vc.additional_config = {"gdn_prefill_backend": cfg["gdn_prefill_backend"]}
    object.__setattr__(vc, "model_config", SimpleNamespace(dtype=dtype, hf_text_config=hf,
                                                           max_model_len=cfg["max_model_len"]))
    if drafts:
        object.__setattr__(vc, "speculative_config", SimpleNamespace(
            num_speculative_tokens=drafts, method="mtp", parallel_drafting=False, use_eagle_block_drop=lambda: False))
    return vc


def page_for(layer):
    """The GDN page padded to a whole number of 16-token attention blocks."""
    state = sum(math.prod(shape) * torch.empty((), dtype=dt).element_size()
                for shape, dt in zip(layer.get_state_shape(), layer.get_state_dtype()))
    per_token = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * torch.empty((), dtype=dtype).element_size()
    return 16 * -(-state // (16 * per_token)) * per_token


def build(vc, hf):
    with set_current_vllm_config(vc), set_default_torch_dtype(dtype), torch.device("cuda"), \
            mock.patch.object(torch.cuda, "current_device", lambda: 0):
        layer = gdn_module.QwenGatedDeltaNetAttention(hf, vc, prefix=PREFIX,
                                                      gqa_interleaved_layout=cfg["layout"] == "interleaved")
        vc.cache_config.mamba_page_size_padded = page_for(layer)
        spec = layer.get_kv_cache_spec(vc)
        pages = torch.zeros((max_seqs + 2) * spec.page_size_bytes, dtype=torch.int8)
        layer.bind_kv_cache(pages.view(max_seqs + 2, 1, 1, spec.page_size_bytes))
        builder = GDNAttentionMetadataBuilder(spec, [PREFIX], vc, torch.device("cuda"))
        table = torch.zeros((max_seqs, 1 + drafts), dtype=torch.int32)
    return layer, builder, table


def decode_row():
    """(new tokens, tokens already seen, drafts or -1)."""
    if not drafts:
        return (1, rng.randint(1, 500), -1)
    d = rng.choice([drafts, drafts, rng.randint(0, drafts)])
    return (1 + d, rng.randint(1, 500), d)


def composition(kind):
    seqs = rng.randint(1, max_seqs)
    if kind == "decode":
        rows = [decode_row() for _ in range(seqs)]
        while sum(q for q, _, _ in rows) > max_tokens:
            rows.pop()
        return rows
    if kind == "prefill":
        budget = rng.choice([rng.randint(1, 40), rng.randint(1, max_tokens)])
        n = rng.randint(1, min(seqs, budget))
        return [(budget // n, rng.choice([0, rng.randint(1, 700)]), -1)] * n
    rows = [decode_row() for _ in range(rng.randint(1, max(1, seqs - 1)))]
    while sum(q for q, _, _ in rows) > max_tokens - 1:
        rows.pop()
    left = max_tokens - sum(q for q, _, _ in rows)
    return rows + [(rng.randint(1, left), rng.choice([0, rng.randint(1, 700)]), -1)]


def step(layer, builder, table, vc, reqs):
    q = [a for a, _, _ in reqs]
    lens = [a + b for a, b, _ in reqs]
    loc = torch.tensor([0, *q], dtype=torch.int32).cumsum(0).to(torch.int32)
    tokens = sum(q)
    prefilling = [d < 0 and (drafts > 0 or a > 1 or b == 0) for a, b, d in reqs]
    cam = CommonAttentionMetadata(
        query_start_loc=loc.to("cuda"), query_start_loc_cpu=loc,
        seq_lens=torch.tensor(lens, dtype=torch.int32, device="cuda"),
        seq_lens_cpu_upper_bound=torch.tensor(lens, dtype=torch.int32), num_reqs=len(q), num_actual_tokens=tokens,
        max_query_len=max(q), max_seq_len=max(lens), block_table_tensor=table[: len(q)],
        slot_mapping=torch.empty(tokens, dtype=torch.int64, device="cuda"), is_prefilling=torch.tensor(prefilling))
    extra = {}
    if drafts:
        extra = {"num_accepted_tokens": torch.ones(len(q), dtype=torch.int32, device="cuda"),
                 "num_decode_draft_tokens_cpu": torch.tensor([d for _, _, d in reqs], dtype=torch.int32)}
    md = builder.build(common_prefix_len=0, common_attn_metadata=cam, **extra)
    with set_current_vllm_config(vc), set_forward_context({PREFIX: md}, vc, num_tokens=tokens):
        layer.forward(torch.empty((tokens, cfg["hidden_size"]), dtype=dtype, device="cuda"))


def profile_step(layer, vc):
    """vLLM's profile run (GPUModelRunner.profile_run -> _dummy_run): a step of max_tokens dummy tokens under no
    attention metadata, in which the layer warms its prefill kernels (_warmup_prefill_kernels)."""
    with set_current_vllm_config(vc), set_forward_context(None, vc, num_tokens=max_tokens):
        layer.forward(torch.empty((max_tokens, cfg["hidden_size"]), dtype=dtype, device="cuda"))


probe_target.one_rank()
hf = hf_config()
vc = config_for(hf)
found = []
host, pins = probe_target.host_stays_real()
with fake_cuda() as eager, host, pins:
    for op in ("qwen_gdn_attention_core", "qwen_gdn_attention_core_fused_norm_packed"):
        torch.library.register_fake(f"vllm::{op}", body_with_eager_layouts(op), allow_override=True)
    layer, builder, table = build(vc, hf)
    table = table.to("cuda")
    for kind in [only] if only else ["profile", "decode", "prefill", "mixed"]:
        start = len(events)
        if kind == "profile":  # once, as the engine runs it once
            profile_step(layer, vc)
        for _ in range(rounds if kind != "profile" else 0):
            step(layer, builder, table, vc, composition(kind))
        found += [{"entry": kind, **e} for e in events[start:]]
for event in found:
    print(json.dumps(event))
for name, label in sorted(set(configs_seen)):
    print(json.dumps({"candidate": name, "config": label}))
