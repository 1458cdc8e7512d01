"""Independent probe: the Triton keys vLLM 0.33's rejection sampler asks for, under the fake target.

Written without kernelcache's exercise code (only its fake driver and fake CUDA tensors, "the same fake
target"): its own minimal CUDA platform, and vLLM's ``RejectionSampler`` called on a seeded random sweep
of batches unlike the exercise's: every batch size 1..MAX_NUM_SEQS, each request with 0..N drafts (at
least one request with one), a random share of greedy rows, random top-k / top-p per batch, draft
probabilities or not, fp32 or bf16 logits. Prints one JSON line per compile() call: {"name", "key", "hit"}.

    python spec_decode_keys.py CAPABILITY SM_COUNT VOCAB MAX_NUM_SEQS NUM_SPECULATIVE_TOKENS
"""

import random
import sys

import probe_target  # this folder: the fake target, a CUDA platform, the compile log

capability, sm_count, vocab, max_num_seqs, num_spec = map(int, sys.argv[1:6])
events = probe_target.start(capability, sm_count)

import torch  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, RejectionSampler  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata  # noqa: E402

from kernelcache.exercise.fake_device import fake_cuda  # noqa: E402

rng = random.Random(20261203)
padded = -(-vocab // 64) * 64

with fake_cuda():
    rejection = RejectionSampler(Sampler())
    for batch in range(1, max_num_seqs + 1):
        for _ in range(2):
            drafts = [rng.randint(0, num_spec) for _ in range(batch)]
            drafts[rng.randrange(batch)] = rng.randint(1, num_spec)  # max_spec_len >= 1
            spec = SpecDecodeMetadata.make_dummy([[0] * n for n in drafts], torch.device("cuda"))
            tokens = sum(drafts)
            greedy = [rng.random() < 0.3 for _ in range(batch)]
            use_k, use_p = rng.random() < 0.5, rng.random() < 0.5

            def full(v, b=batch):
                return torch.full((b,), v, device="cuda")

            temperature = torch.tensor([GREEDY_TEMPERATURE if g else 0.8 for g in greedy], device="cuda")
            md = SamplingMetadata(
                temperature=temperature, all_greedy=all(greedy), all_random=not any(greedy),
                top_p=full(0.9) if use_p else None, top_k=full(40) if use_k else None,
                generators={i: torch.Generator().manual_seed(i) for i in range(batch) if not greedy[i]},
                max_num_logprobs=None, logprob_token_ids=None, no_penalties=True, prompt_token_ids=None,
                frequency_penalties=full(0.0), presence_penalties=full(0.0), repetition_penalties=full(1.0),
                output_token_ids=[[] for _ in range(batch)], spec_token_ids=[[] for _ in range(batch)],
                allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
            dtype = rng.choice([torch.float32, torch.bfloat16])
            logits = torch.empty((tokens + batch, padded), dtype=dtype, device="cuda")[:, :vocab]
            probs = torch.empty((tokens, vocab), dtype=torch.float32, device="cuda") if rng.random() < 0.5 else None
            rejection(spec, probs, logits, md)
probe_target.report(events)
