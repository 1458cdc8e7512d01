#!/usr/bin/env python3
"""Issue 14's GPU proof for the V1 runner's speculative decoding: vLLM's ``RejectionSampler`` on real tensors.

A child process runs a seeded sweep of drafted batches unlike the build's (tests/probes/spec_decode_keys.py's
recipe on real values: batch 1..MAX_NUM_SEQS in steps, 0..N drafts per request, a random greedy share, random
top-k / top-p, draft probabilities or not, fp32 or bf16 logits) and reports every Triton compile() call
(disk hit or compile), the wall time of its first and of all calls, and a digest of every output token.
The parent runs it twice, each in a fresh process: ``bundle`` (the CPU-built bundle installed at a fresh path
and served through ``kernelcache env``) and ``cold`` (an empty Triton cache). Done means: bundle 0 compiles,
the same output digest as cold.

    python scripts/gpu/spec_decode_check.py --bundle B.tar.zst --vocab 128256 --out spec.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEQS, SPEC = 256, 3


def child(vocab: int) -> dict:
    import torch
    import triton

    events = []

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        events.append({"name": src.name, "hit": bool(cache_hit)})

    triton.knobs.compilation.listener = listener
    torch.zeros(1, device="cuda")
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    torch.manual_seed(0)
    sampler = RejectionSampler(Sampler())
    digest, first, started = hashlib.sha256(), None, time.perf_counter()
    for n, args in enumerate(batches(vocab)):
        mark = time.perf_counter()
        out = sampler(*args)
        torch.cuda.synchronize()
        if n == 0:
            first = time.perf_counter() - mark
        digest.update(out.sampled_token_ids.cpu().numpy().tobytes())
    total = time.perf_counter() - started
    compiled = [e["name"] for e in events if not e["hit"]]
    return {"calls": n + 1, "first_call_s": first, "all_calls_s": total, "compile_events": len(events),
            "compiles": len(compiled), "compiled": sorted(set(compiled)), "digest": digest.hexdigest()}


def batches(vocab: int):
    """(metadata, draft probs, logits, sampling metadata) for each drafted batch of the sweep."""
    import torch
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    rng = random.Random(20261203)
    padded = -(-vocab // 64) * 64
    for batch in [1, 2, 3, 5, 8, 13, 16, 31, 32, 33, 64, 65, 100, 128, 200, 255, 256]:
        drafts = [rng.randint(0, SPEC) for _ in range(batch)]
        drafts[rng.randrange(batch)] = rng.randint(1, SPEC)
        tokens = sum(drafts)
        spec = SpecDecodeMetadata(
            draft_token_ids=torch.randint(0, vocab, (tokens,), device="cuda", dtype=torch.int32),
            num_draft_tokens=drafts, **_offsets(drafts))
        dtype = rng.choice([torch.float32, torch.bfloat16])
        logits = torch.randn((tokens + batch, padded), device="cuda").to(dtype)[:, :vocab]
        probs = torch.softmax(torch.randn((tokens, vocab), device="cuda"), -1) if rng.random() < 0.5 else None
        yield spec, probs, logits, _sampling(batch, rng)


def _offsets(drafts: list[int]) -> dict:
    """SpecDecodeMetadata's index tensors, as SpecDecodeMetadata.make_dummy computes them."""
    import numpy as np
    import torch

    cu_draft = np.cumsum(drafts, dtype=np.int32)
    cu_sampled = np.cumsum([d + 1 for d in drafts], dtype=np.int32)
    target = np.concatenate([np.arange(s - d - 1, s - 1) for s, d in zip(cu_sampled, drafts)]).astype(np.int32)
    bonus = (cu_sampled - 1).astype(np.int32)
    logits = np.concatenate([np.arange(s - d - 1, s) for s, d in zip(cu_sampled, drafts)]).astype(np.int32)
    cuda = {"device": "cuda"}
    return {"cu_num_draft_tokens": torch.from_numpy(cu_draft).to(**cuda),
            "cu_num_sampled_tokens": torch.from_numpy(cu_sampled).to(**cuda),
            "target_logits_indices": torch.from_numpy(target).to(**cuda),
            "bonus_logits_indices": torch.from_numpy(bonus).to(**cuda),
            "logits_indices": torch.from_numpy(logits).to(**cuda)}


def _sampling(batch: int, rng: random.Random):
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE

    greedy = [rng.random() < 0.3 for _ in range(batch)]
    use_k, use_p = rng.random() < 0.5, rng.random() < 0.5

    def full(v):
        return torch.full((batch,), v, device="cuda")

    generators = {}
    for i in range(batch):
        if not greedy[i] and rng.random() < 0.5:
            generators[i] = torch.Generator(device="cuda").manual_seed(i)
    return SamplingMetadata(
        temperature=torch.tensor([GREEDY_TEMPERATURE if g else 0.8 for g in greedy], device="cuda"),
        all_greedy=all(greedy), all_random=not any(greedy), top_p=full(0.9) if use_p else None,
        top_k=full(40).to(torch.int32) if use_k else None, generators=generators, max_num_logprobs=None,
        logprob_token_ids=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=full(0.0),
        presence_penalties=full(0.0), repetition_penalties=full(1.0), output_token_ids=[[] for _ in range(batch)],
        spec_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())


def run(mode: str, bundle: str, vocab: int, root: Path) -> dict:
    cache = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=root)) / "cache"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    if mode == "bundle":
        subprocess.run([sys.executable, "-m", "kernelcache", "install", bundle, "--cache-dir", str(cache)],
                       check=True, env=env, capture_output=True)
        found = subprocess.run([sys.executable, "-m", "kernelcache", "env", "--cache-dir", str(cache), "--json"],
                               check=True, env=env, capture_output=True, text=True)
        env.update(json.loads(found.stdout))
    done = subprocess.run([sys.executable, __file__, "--child", "--vocab", str(vocab)], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        return {"mode": mode, "error": done.stderr[-3000:]}
    return {"mode": mode, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--bundle")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--out", default="spec.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.vocab)))
        return 0
    root = Path(tempfile.mkdtemp(prefix="kc-spec-"))
    rows = [run(mode, args.bundle, args.vocab, root) for mode in ("bundle", "cold")]
    same = len({r.get("digest") for r in rows}) == 1 and "digest" in rows[0]
    result = {"rows": rows, "same_outputs": same, "ok": same and rows[0].get("compiles") == 0}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
