"""The mrv1_spec_decode check on a GPU (scripts/gpu/prove.py spec_decode): vLLM's ``RejectionSampler`` on real
tensors.

A seeded sweep of drafted batches unlike the build's (tests/probes/spec_decode_keys.py's recipe on real values:
batch 1..max_num_seqs in steps, 0..num_speculative_tokens drafts per request, a random greedy share, random
top-k / top-p, draft probabilities or not, fp32 or bf16 logits), sized by the bundle's task; each batch's output
tokens are kept as outputs, the first call and all calls timed.
"""

from __future__ import annotations

import random
import time

BATCHES = (1, 2, 3, 5, 8, 13, 16, 31, 32, 33, 64, 65, 100, 128, 200, 255)


def check(tasks: list[dict], records: list[dict]) -> dict:
    import torch
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    task = tasks[0]["kwargs"]
    torch.manual_seed(0)
    sampler = RejectionSampler(Sampler())
    outputs, first, started = {}, None, time.perf_counter()
    for n, args in enumerate(batches(task["vocab"], task["max_num_seqs"], task["num_speculative_tokens"])):
        mark = time.perf_counter()
        out = sampler(*args)
        torch.cuda.synchronize()
        if n == 0:
            first = time.perf_counter() - mark
        outputs[f"{n:03d}"] = out.sampled_token_ids.cpu()
    return {"calls": len(outputs), "first_call_s": first, "all_calls_s": time.perf_counter() - started,
            "outputs": outputs}


def batches(vocab: int, seqs: int, spec: int):
    """(metadata, draft probs, logits, sampling metadata) for each drafted batch of the sweep."""
    import torch
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    rng = random.Random(20261203)
    padded = -(-vocab // 64) * 64
    for batch in [b for b in BATCHES if b < seqs] + [seqs]:
        drafts = [rng.randint(0, spec) for _ in range(batch)]
        drafts[rng.randrange(batch)] = rng.randint(1, spec)
        tokens = sum(drafts)
        metadata = SpecDecodeMetadata(
            draft_token_ids=torch.randint(0, vocab, (tokens,), device="cuda", dtype=torch.int32),
            num_draft_tokens=drafts, **_offsets(drafts))
        dtype = rng.choice([torch.float32, torch.bfloat16])
        logits = torch.randn((tokens + batch, padded), device="cuda").to(dtype)[:, :vocab]
        probs = torch.softmax(torch.randn((tokens, vocab), device="cuda"), -1) if rng.random() < 0.5 else None
        yield metadata, probs, logits, _sampling(batch, rng)


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
