"""What the exercise drivers (exercise/vllm_*.py) share: the target mode, the device scope their tensors live in,
Triton's presence in vLLM, the SM count and top-k/top-p batch classes vLLM sizes its sampler kernels by, logits
as an LM head returns them, and the FlashAttention version vLLM picks on the target. Public: a new family's
driver imports them from here, not from a sibling driver."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

SPLIT_MAX_BATCH = 64  # vllm/v1/sample/ops/topk_topp_triton.py _SPLIT_MAX_BATCH
VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE


def cross() -> bool:
    """Whether this exercise process runs behind the fake target (cross mode)."""
    return os.environ.get("KERNELCACHE_TARGET_MODE") == "cross"


def device_scope():
    """The scope a driver's tensors live in: the fake CUDA device in cross mode (exercise/fake_device.py)."""
    if cross():
        from .fake_device import fake_cuda

        return fake_cuda()
    return contextlib.nullcontext()


def require_triton() -> None:
    """Refuse a process where vLLM disabled Triton: nothing would compile."""
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        raise RuntimeError("vLLM disabled Triton in this process (HAS_TRITON is False); nothing would compile")


def batch_classes(vocab: int, max_batch: int, sm_count: int) -> list[int]:
    """One batch size per distinct top-k/top-p specialization: B==1, each split count S, B>64."""
    from vllm.v1.sample.ops.topk_topp_triton import _topp_split_count

    seen, picks = set(), []
    for batch in range(1, max_batch + 1):
        split = _topp_split_count(batch, vocab, sm_count) if batch <= SPLIT_MAX_BATCH else None
        cls = (batch == 1, batch <= SPLIT_MAX_BATCH, split)
        if cls not in seen:
            seen.add(cls)
            picks.append(batch)
    return picks


def sm_count() -> int:
    """The SM count vLLM's platform reports (the profile's, in cross mode)."""
    from vllm.utils.platform_utils import num_compute_units

    return num_compute_units()


def model_logits(batch: int, vocab: int, dtype) -> Any:
    """Logits as the LM head returns them: padded to a multiple of 64 columns, then sliced."""
    import torch

    padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
    logits = torch.randn((batch, padded), dtype=dtype, device="cuda")
    return logits[:, :vocab]


def fa_version(major: int) -> int:
    """The FlashAttention version vLLM runs on a GPU of capability ``major`` with its own FlashAttention builds
    (``fa_utils.get_flash_attn_version``: FA3 on Hopper, FA4 on Blackwell, FA2 otherwise)."""
    return {9: 3, 10: 4}.get(major, 2)


@contextlib.contextmanager
def answering_flash_attn_version(version: int) -> Iterator[None]:
    """``get_flash_attn_version`` answers ``version``, not what loads on a machine without the GPU (there: none, so
    vLLM's selector would pass over FLASH_ATTN; in the exercises it decides FlashAttention's kernel block sizes).
    vllm/v1/attention/backends/flash_attn.py imports it by name from fa_utils: fa_utils is answered first, so a
    flash_attn first imported inside takes the answer too, and both get fa_utils' own back after."""
    import importlib

    modules = [importlib.import_module("vllm.v1.attention.backends.fa_utils")]
    saved = modules[0].get_flash_attn_version
    modules[0].get_flash_attn_version = lambda *args, **kwargs: version
    try:
        modules.append(importlib.import_module("vllm.v1.attention.backends.flash_attn"))
        modules[1].get_flash_attn_version = modules[0].get_flash_attn_version
        yield
    finally:
        for module in modules:
            module.get_flash_attn_version = saved
