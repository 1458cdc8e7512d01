"""What the checks share: for the autotuned layers (tests/gpu_checks/mamba.py, gdn.py) their steps, counts per
kernel, the autotune JSON Triton wrote, the error against a reference; for every state prove.py runs, the nvcc runs
its wrapper logged (``nvcc_runs``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

NVCC_LOG = "KERNELCACHE_PROVE_NVCC_LOG"  # where prove.py's nvcc wrapper logs a state's runs
PROFILE = "profile"  # the engine's profile run (its output is the layer's unwritten buffer: not kept)
FIRST = 300  # tokens of the first prefill: several chunks, the last partial


def steps(max_seqs: int, max_tokens: int, extra: tuple = ()) -> list[tuple[str, tuple]]:
    """(label, requests) with requests as (new tokens, tokens already in the state, *extra); request i owns block
    i + 1: the profile run, a fresh prefill, its decode, a decode of up to 8 requests, a mixed batch, a continued
    chunked prefill, a ``max_tokens`` prefill."""
    first, decodes = min(FIRST, max_tokens - 1), min(8, max_seqs)
    return [(PROFILE, ((max_tokens, 0, *extra),)), ("prefill", ((first, 0, *extra),)),
            ("decode-1", ((1, first, *extra),)), (f"decode-{decodes}", ((1, first + 1, *extra),) * decodes),
            ("mixed", ((1, 40, *extra),) * min(3, max_seqs - 1) + ((100, 0, *extra),)),
            ("continued", ((1, 50, *extra), (77, 37, *extra))), ("prefill-max", ((max_tokens, 0, *extra),))]


def nvcc_runs() -> int:
    """The nvcc runs prove.py's wrapper logged so far for this process's state (FlashInfer's JIT builds)."""
    try:
        return len(Path(os.environ[NVCC_LOG]).read_text().splitlines())
    except (KeyError, OSError):
        return 0


def count_by_kernel(records: list[dict]) -> dict:
    counts: dict = {}
    for r in records:
        row = counts.setdefault(r["name"], {"compiles": 0, "hits": 0})
        row["hits" if r["cache_hit"] else "compiles"] += 1
    return counts


def autotune_json() -> list[str]:
    """The ``*.autotune.json`` files Triton wrote into the cache during this run (TRITON_CACHE_AUTOTUNING=1)."""
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*.autotune.json"))


def error(got, want) -> dict:
    diff = (got.float() - want.float()).abs()
    return {"max_abs": float(diff.max()), "max_rel": float(diff.max() / want.float().abs().max().clamp_min(1e-6))}


def timed(module, layer, label: str, batch, outputs: dict, inputs: dict) -> float:
    """One step of ``module``'s layer (its ``profile`` for the profile run, ``forward`` otherwise) on seeded
    hidden states, synchronized and timed; a request step's output and input are kept. Its seconds."""
    import torch

    from kernelcache.exercise.layers import random_hidden

    hidden = random_hidden(layer, batch)
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = (module.profile if label == PROFILE else module.forward)(layer, batch, hidden)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    if label != PROFILE:
        outputs[label], inputs[label] = out.float().cpu(), hidden.cpu()
    return seconds
