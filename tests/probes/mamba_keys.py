"""Independent probe: the Triton keys vLLM 0.33's Mamba-2 mixer asks for under the fake target, every candidate
config of the autotuned SSD kernels included.

Written without kernelcache's Mamba exercise code (only its fake driver, fake CUDA tensors and the import shims of
exercise/fake_ops.py, "the same fake target"): its own CUDA platform (the probes' minimal one plus the capability,
device name and PDL answer vLLM's CUDA platform gives), the mixer built from a Nemotron-H-style config dict the
way ``NemotronHMambaDecoderLayer`` builds it, its own state buffer, metadata built by vLLM's
``Mamba2AttentionMetadataBuilder`` from its own ``CommonAttentionMetadata``, and a seeded random sweep of batch
compositions (decodes, fresh and continued prefills, mixes) within the limits, after the engine's profile run.

Autotuning here: the fake driver gets a benchmarker that calls each candidate once (so Triton's own
``Autotuner.run`` -> ``prune_configs`` -> ``_bench`` compiles it) and ranks them all equal; every autotune cache is
dropped before each launch (``Autotuner.cache``, vLLM's ``_autotuned_configs``) and ``TRITON_CACHE_AUTOTUNING`` is
0, so each launch benchmarks again: every candidate x every specialization, what the GPU may compile (its winner
is not known here). The custom op ``vllm::mamba_mixer2`` gets its Python body as fake implementation, so it runs
under the fake mode.

Prints one JSON line per compile() call, {"entry", "name", "key", "hit"}, then one per candidate config the
autotuner benchmarked, {"candidate": kernel name, "config": its meta-parameters, num_warps, num_stages as JSON}.

    python mamba_keys.py CAPABILITY SM_COUNT PRODUCT CONFIG_JSON MAX_NUM_SEQS MAX_NUM_BATCHED_TOKENS ROUNDS [ENTRY]

CONFIG_JSON: hidden_size, mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups, conv_kernel, chunk_size,
dtype, mamba_ssm_cache_dtype. ENTRY: profile (the engine's profile run, once), decode, prefill, mixed (default:
all).
"""

import json
import os
import random
import sys
from types import SimpleNamespace

import probe_target  # this folder: the fake target, a CUDA platform, the compile log

capability, sm_count, product = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cfg = json.loads(sys.argv[4])
max_seqs, max_tokens, rounds = map(int, sys.argv[5:8])
only = sys.argv[8] if len(sys.argv) > 8 else None
os.environ["TRITON_CACHE_AUTOTUNING"] = "0"  # before vLLM's env_override sets its default of 1
events = probe_target.start(capability, sm_count)

import torch  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402


class MambaProbeCuda(type(vllm.platforms._current_platform)):
    @classmethod
    def get_device_capability(cls, device_id=0):
        return DeviceCapability(capability // 10, capability % 10)

    @classmethod
    def get_device_name(cls, device_id=0):
        return product

    @classmethod
    def is_arch_support_pdl(cls):
        return capability >= 90  # CudaPlatform.is_arch_support_pdl


vllm.platforms._current_platform = MambaProbeCuda()
import vllm._custom_ops  # noqa: E402, F401

from kernelcache.exercise import fake_ops  # noqa: E402
from kernelcache.exercise.fake_device import fake_cuda  # noqa: E402

fake_ops.install()
if not hasattr(torch.ops._C, "cutlass_scaled_mm_supports_fp8"):  # online fp8 linear methods ask it at import
    _lib = torch.library.Library("_C", "FRAGMENT")
    _lib.define("cutlass_scaled_mm_supports_fp8(int cuda_device_capability) -> bool")
    _lib.impl("cutlass_scaled_mm_supports_fp8", lambda c: c >= 89, "CompositeExplicitAutograd")

from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.mamba import mamba_mixer2  # noqa: E402
from vllm.model_executor.layers.mamba.ops import triton_helpers  # noqa: E402
from vllm.model_executor.layers.mamba.ops.ssu_dispatch import initialize_mamba_ssu_backend  # noqa: E402
from vllm.utils.torch_utils import set_default_torch_dtype  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec  # noqa: E402

rng = random.Random(20261204)
PREFIX = "backbone.layers.3.mixer"
dtype = getattr(torch, cfg["dtype"])


configs_seen = probe_target.every_candidate()
torch.library.register_fake("vllm::mamba_mixer2", mamba_mixer2.mamba_mixer2, allow_override=True)


def config_for():
    vc = VllmConfig()
    vc.scheduler_config.max_num_seqs = max_seqs
    vc.scheduler_config.max_num_batched_tokens = max_tokens
    vc.cache_config.enable_prefix_caching = False
    vc.cache_config.mamba_cache_mode = "none"
    vc.cache_config.mamba_ssm_cache_dtype = cfg["mamba_ssm_cache_dtype"]
    vc.cache_config.mamba_block_size = 4096
    model = SimpleNamespace(dtype=dtype, get_mamba_chunk_size=lambda: cfg["chunk_size"])
    object.__setattr__(vc, "model_config", model)
    return vc


def build(vc):
    """``MambaMixer2`` with the arguments ``NemotronHMambaDecoderLayer`` passes, from the config dict."""
    with set_current_vllm_config(vc), set_default_torch_dtype(dtype), torch.device("cuda"):
        mixer = mamba_mixer2.MambaMixer2(
            hidden_size=cfg["hidden_size"], ssm_state_size=cfg["ssm_state_size"],
            conv_kernel_size=cfg["conv_kernel"], intermediate_size=cfg["mamba_num_heads"] * cfg["mamba_head_dim"],
            use_conv_bias=True, use_bias=False, n_groups=cfg["n_groups"], num_heads=cfg["mamba_num_heads"],
            head_dim=cfg["mamba_head_dim"], rms_norm_eps=1e-5, activation="silu", model_config=vc.model_config,
            cache_config=vc.cache_config, prefix=PREFIX)
        spec = mixer.get_kv_cache_spec(vc)
        pages = torch.zeros((max_seqs + 3) * spec.page_size_bytes, dtype=torch.int8)
        mixer.bind_kv_cache(pages.view(max_seqs + 3, 1, 1, spec.page_size_bytes))
        initialize_mamba_ssu_backend(vc.mamba_config, KVCacheConfig(1, [], [KVCacheGroupSpec([PREFIX], spec)]))
        builder = Mamba2AttentionMetadataBuilder(spec, [PREFIX], vc, torch.device("cuda"))
        table = torch.zeros((max_seqs, 1), dtype=torch.int32)
    return mixer, builder, table


def composition(kind):
    """(new tokens, tokens already seen) per request, decodes first."""
    seqs = rng.randint(1, max_seqs)
    if kind == "decode":
        return [(1, rng.randint(1, 500))] * seqs
    if kind == "prefill":
        budget = rng.choice([rng.randint(1, 40), rng.randint(1, max_tokens)])
        n = rng.randint(1, min(seqs, budget))
        sizes = [budget // n] * n
        return [(q, rng.choice([0, rng.randint(1, 700)]) if q > 1 else 0) for q in sizes]
    d = rng.randint(1, max(1, min(seqs, max_tokens - 2) - 1))
    left = max_tokens - d
    return [(1, rng.randint(1, 500))] * d + [(rng.randint(2, left), rng.choice([0, rng.randint(1, 700)]))]


def step(mixer, builder, table, vc, reqs):
    q = [a for a, _ in reqs]
    lens = [a + b for a, b in reqs]
    loc = torch.tensor([0, *q], dtype=torch.int32).cumsum(0).to(torch.int32)
    tokens = sum(q)
    cam = CommonAttentionMetadata(
        query_start_loc=loc.to("cuda"), query_start_loc_cpu=loc, seq_lens=torch.tensor(lens, dtype=torch.int32,
                                                                                         device="cuda"),
        seq_lens_cpu_upper_bound=torch.tensor(lens, dtype=torch.int32), num_reqs=len(q), num_actual_tokens=tokens,
        max_query_len=max(q), max_seq_len=max(lens), block_table_tensor=table[: len(q)],
        slot_mapping=torch.empty(tokens, dtype=torch.int64, device="cuda"),
        is_prefilling=torch.tensor([a > 1 or b == 0 for a, b in reqs]))
    md = builder.build(common_prefix_len=0, common_attn_metadata=cam)
    triton_helpers._autotuned_configs.clear()
    with set_current_vllm_config(vc), set_forward_context({PREFIX: md}, vc, num_tokens=tokens):
        mixer.forward(torch.empty((tokens, cfg["hidden_size"]), dtype=dtype, device="cuda"))


def profile_step(mixer, vc):
    """vLLM's profile run (GPUModelRunner.profile_run -> _dummy_run): a step of max_tokens dummy tokens under no
    attention metadata, in which the mixer warms its SSD kernels (MambaMixer2._warmup_ssd_kernels)."""
    triton_helpers._autotuned_configs.clear()
    # The op's Python body, called as a function: a fake impl runs without the torch function modes (the fake
    # target's), and the warmup makes device tensors from Python lists, which only those modes keep fake.
    ops = torch.ops.vllm
    saved = ops.__dict__.get("mamba_mixer2")
    ops.mamba_mixer2 = mamba_mixer2.mamba_mixer2
    try:
        with set_current_vllm_config(vc), set_forward_context(None, vc, num_tokens=max_tokens):
            mixer.forward(torch.empty((max_tokens, cfg["hidden_size"]), dtype=dtype, device="cuda"))
    finally:
        if saved is None:
            del ops.mamba_mixer2
        else:
            ops.mamba_mixer2 = saved


probe_target.one_rank()
vc = config_for()
found = []
host, pins = probe_target.host_stays_real()
with fake_cuda(), host, pins:
    mixer, builder, table = build(vc)
    table = table.to("cuda")
    for kind in [only] if only else ["profile", "decode", "prefill", "mixed"]:
        start, seen = len(events), len(configs_seen)
        if kind == "profile":  # once, as the engine runs it once
            profile_step(mixer, vc)
        for _ in range(rounds if kind != "profile" else 0):
            step(mixer, builder, table, vc, composition(kind))
        found += [{"entry": kind, **e} for e in events[start:]]
for event in found:
    print(json.dumps(event))
for name, label in sorted(set(configs_seen)):
    print(json.dumps({"candidate": name, "config": label}))
