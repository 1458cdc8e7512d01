"""Drive vLLM's real sampler code so Triton compiles every key the GPU will ask for.

Each public function is one exercise task (see exercise/worker.py) and returns a JSON summary:

* ``registry``: vLLM's own ``JitWarmupRegistry`` over ``register_top_k_top_p_warmups()`` -- every
  top-k/top-p specialization vLLM itself enumerates for the config;
* ``mrv1``: ``vllm.v1.sample.sampler.Sampler`` on the ``_dummy_sampler_run`` metadata, with a seeded
  generator (PR #41375's recipe: the ``forward_native`` Triton path) and, where FlashInfer is not
  used, without; on logits as the LM head returns them (padded to 64 columns and sliced, in each
  model dtype), since the Triton top-k/top-p kernel takes the row stride: fp32 logits keep the padded
  stride, bf16/fp16 ones are copied to fp32 by ``Sampler.forward`` (dense, except a single row);
* ``mrv2``: Model Runner V2's seeded sampling sequence (temperature, min-p, ``apply_top_k_top_p``,
  fp32 ``gumbel_sample``) and its greedy / unprocessed sequence (``gumbel_sample`` on model-dtype
  logits), with the argument dtypes and layouts of ``v1/worker/gpu/sample/sampler.py``.

In cross mode ``setup_platform`` installs a CUDA platform with the profile's SM count (what vLLM
reads to size the split top-p pipeline) and tensors are fake CUDA tensors (exercise/fake_device.py);
in native mode vLLM's real platform and real tensors are used and these functions run on the GPU.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections import Counter
from typing import Any

from ..hooks.kernelcache_tritonkey import AfterImport
from .drivers import batch_classes, cross, device_scope, model_logits, require_triton, sm_count
from .watch import seen


def setup_platform(capability: int, sm_count: int, product: str = "NVIDIA GPU") -> None:
    """Make vLLM resolve a CUDA platform for the target (cross mode), before any sampler import: at once where vLLM
    is imported already, else as soon as its package is (hooks' ``AfterImport``), so a unit that runs no vLLM code
    (kernelcache's test kernels) never pays vLLM's import (about 3 s of CPU a process)."""
    if "vllm" in sys.modules:
        _target_platform(capability, sm_count, product)
        return
    sys.meta_path.insert(0, AfterImport("vllm", lambda vllm: _target_platform(capability, sm_count, product)))
    # What importing vLLM does to the environment (vllm/env_override.py), done here too: the bundle records the
    # Triton variables set in its exercise processes (format/identity.py), the same whether a unit imported vLLM.
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")


def _target_platform(capability: int, sm_count: int, product: str) -> None:
    import vllm.platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class TargetCudaPlatform(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        dist_backend = "nccl"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(capability // 10, capability % 10)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return product

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return sm_count

    vllm.platforms._current_platform = TargetCudaPlatform()


# -- registry -------------------------------------------------------------------------------------


def registry(vocab: int, max_num_seqs: int, num_speculative_tokens: int = 0) -> dict:
    """vLLM's own compile-key enumeration and warmup for the top-k/top-p kernels."""
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry
    from vllm.v1.sample.ops.topk_topp_sampler import register_top_k_top_p_warmups

    require_triton()
    config = registry_config(vocab, max_num_seqs, num_speculative_tokens)
    reg = JitWarmupRegistry(config)
    with reg.activate():
        register_top_k_top_p_warmups()
    keys = {kernel_name(kernel): len(set(kernel.get_warmup_keys(vllm_config=config)))
            for kernel in reg._registrations}
    if not keys:
        raise RuntimeError("vLLM registered no top-k/top-p warmups for this platform")
    reg.warmup()
    return {"registrations": len(reg), "keys": keys}


def registry_config(vocab: int, max_num_seqs: int, num_speculative_tokens: int) -> Any:
    """The parts of a ``VllmConfig`` vLLM's warmup registrations read."""
    from types import SimpleNamespace

    return SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: vocab),
                           scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
                           num_speculative_tokens=num_speculative_tokens)


def kernel_name(dispatcher: Any) -> str:
    kernel = getattr(dispatcher, "kernel", None)
    fn = getattr(kernel, "fn", kernel)
    return getattr(fn, "__name__", type(dispatcher).__name__)


# -- MRV1 -----------------------------------------------------------------------------------------


MODES = {"top_k": (True, False), "top_p": (False, True), "top_k_top_p": (True, True)}


def mrv1(vocab: int, modes: list[str], batch_sizes: list[int] | None = None, max_batch: int | None = None,
         seeded: bool = True, unseeded: bool = False, dtypes: list[str] | None = None) -> dict:
    """``Sampler()(logits, metadata)`` per batch size, mode and LM-head dtype (padded-row logits)."""
    import torch
    from vllm.v1.sample.sampler import Sampler

    require_triton()
    batch_sizes = batch_sizes or batch_classes(vocab, max_batch, sm_count())
    sampler = Sampler()
    calls = Counter()
    with device_scope():
        for batch in batch_sizes:
            for mode, dtype in itertools.product(modes, dtypes or ["float32"]):
                use_k, use_p = MODES[mode]
                metadata = mrv1_metadata(batch, vocab, use_k, use_p)
                for with_seed in ([True] if seeded else []) + ([False] if unseeded else []):
                    generators = {0: seeded_generator(seed=0)} if with_seed else {}
                    logits = model_logits(batch, vocab, getattr(torch, dtype))
                    output = sampler(logits=logits, sampling_metadata=replace_metadata(metadata, generators=generators))
                    seen("sampler.sampled", tokens=output.sampled_token_ids)
                    calls[f"{mode}:{dtype}{':seeded' if with_seed else ''}"] += 1
    return {"forward": sampler.topk_topp_sampler.forward.__name__, "batch_sizes": batch_sizes, "calls": dict(calls)}


def seeded_generator(seed: int):
    """The seeded generator of a request. Cross mode: a CPU generator (CPU torch has no CUDA RNG);
    it only feeds ``exponential_`` in ``random_sample``, a torch op, never a Triton key."""
    import torch

    device = "cpu" if cross() else "cuda"
    return torch.Generator(device=device).manual_seed(seed)


def mrv1_metadata(batch: int, vocab: int, use_k: bool, use_p: bool):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    def full(value):
        return torch.full((batch,), value, device="cuda")

    return SamplingMetadata(
        temperature=full(0.5),
        all_greedy=False,
        all_random=False,
        top_p=full(0.9) if use_p else None,
        top_k=full(vocab - 1 if use_p else 50) if use_k else None,
        generators={},
        max_num_logprobs=None,
        logprob_token_ids=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=full(0.1),
        presence_penalties=full(0.1),
        repetition_penalties=full(0.1),
        output_token_ids=[[] for _ in range(batch)],
        spec_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def replace_metadata(metadata, **changes):
    from dataclasses import replace

    return replace(metadata, **changes)


# -- MRV2 -----------------------------------------------------------------------------------------


def mrv2(vocab: int, modes: list[str], model_dtypes: list[str], max_num_reqs: int,
         batch_sizes: list[int] | None = None, max_batch: int | None = None, min_p: bool = True,
         fp64_gumbel: bool = False) -> dict:
    """MRV2's sampling kernels with the dtypes and layouts of its Sampler.sample()."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample
    from vllm.v1.worker.gpu.sample.min_p import apply_min_p

    require_triton()
    batch_sizes = batch_sizes or batch_classes(vocab, max_batch, sm_count())
    calls = Counter()
    with device_scope():
        state = _mrv2_state(max_num_reqs)
        for batch in batch_sizes:
            mapping = torch.arange(batch, dtype=torch.int64, device="cuda")
            pos = torch.zeros(batch, dtype=torch.int64, device="cuda")
            for mode in modes:  # a seeded (or processed) request: fp32 copy, then the chain
                use_k, use_p = MODES[mode]
                logits = model_logits(batch, vocab, getattr(torch, model_dtypes[0] if model_dtypes else "float32"))
                processed = torch.empty_like(logits, dtype=torch.float32).copy_(logits)
                apply_temperature(processed, mapping, state["temperature"])
                if min_p:
                    apply_min_p(processed, mapping, state["min_p"])
                top_k = state["top_k"][mapping] if use_k else None
                top_p = state["top_p"][mapping] if use_p else None
                processed = apply_top_k_top_p(processed, top_k, top_p, has_topp_only_rows=use_p and not use_k)
                if use_k and use_p:  # a batch mixing top-k rows with top-p-only rows
                    apply_top_k_top_p(processed, top_k, top_p, has_topp_only_rows=True)
                tokens = gumbel_sample(processed, mapping, state["temperature"], state["seeds"], pos,
                                       apply_temperature=False, is_drafting=False, use_fp64=fp64_gumbel)
                seen("sampler.sampled", tokens=tokens)
                calls[f"seeded:{mode}"] += 1
            for name in model_dtypes:  # greedy or unprocessed: raw model-dtype logits
                logits = model_logits(batch, vocab, getattr(torch, name))
                tokens = gumbel_sample(logits, mapping, state["temperature"], state["seeds"], pos,
                                       apply_temperature=True, is_drafting=False, use_fp64=fp64_gumbel)
                seen("sampler.sampled", tokens=tokens)
                calls[f"greedy:{name}"] += 1
    return {"batch_sizes": batch_sizes, "calls": dict(calls)}


def _mrv2_state(max_num_reqs: int) -> dict:
    """SamplingStates' per-request tensors (v1/worker/gpu/sample/states.py), with their dtypes."""
    import torch

    return {
        "temperature": torch.full((max_num_reqs,), 0.7, dtype=torch.float32, device="cuda"),
        "top_k": torch.full((max_num_reqs,), 50, dtype=torch.int32, device="cuda"),
        "top_p": torch.full((max_num_reqs,), 0.9, dtype=torch.float32, device="cuda"),
        "min_p": torch.full((max_num_reqs,), 0.1, dtype=torch.float32, device="cuda"),
        "seeds": torch.full((max_num_reqs,), 1234, dtype=torch.int64, device="cuda"),
    }


# -- FlashInfer (native mode) ---------------------------------------------------------------------


def flashinfer(vocab: int, batch: int = 16) -> dict:
    """vLLM's ``flashinfer_sample`` in its three call shapes (k, p, both): FlashInfer JIT-builds ``sampling``."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import flashinfer_sample

    logits = torch.randn((batch, vocab), dtype=torch.float32, device="cuda")
    k = torch.full((batch,), 50, dtype=torch.int32, device="cuda")
    p = torch.full((batch,), 0.9, dtype=torch.float32, device="cuda")
    for top_k, top_p in ((k, None), (None, p), (k, p)):
        flashinfer_sample(logits.clone(), top_k, top_p)
    torch.cuda.synchronize()
    return {"shapes": 3}
