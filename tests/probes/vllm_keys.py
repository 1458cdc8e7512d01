"""Independent probe: the Triton keys vLLM 0.33's own code asks for, under the fake target.

Written without kernelcache's exercise code (only its fake driver and fake CUDA tensors, "the same
fake target"): its own minimal CUDA platform, vLLM's JitWarmupRegistry called directly, MRV1's
Sampler on every batch size in a range, MRV2's seeded chain called directly. Prints one JSON line
per compile() call: {"name", "key", "hit"}. PATHS (comma-separated; default all three) picks what runs:
registry, mrv1, mrv2.

    python vllm_keys.py CAPABILITY SM_COUNT VOCAB MAX_NUM_SEQS [PATHS]
"""

import sys

import probe_target  # this folder: the fake target, a CUDA platform, the compile log

capability, sm_count, vocab, max_num_seqs = map(int, sys.argv[1:5])
paths = set(sys.argv[5].split(",")) if len(sys.argv) > 5 else {"registry", "mrv1", "mrv2"}
assert paths <= {"registry", "mrv1", "mrv2"}, paths
events = probe_target.start(capability, sm_count)

import torch  # noqa: E402
from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p, register_top_k_top_p_warmups  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample  # noqa: E402
from vllm.v1.worker.gpu.sample.min_p import apply_min_p  # noqa: E402

from kernelcache.exercise.fake_device import fake_cuda  # noqa: E402

ns = __import__("types").SimpleNamespace
config = ns(model_config=ns(get_vocab_size=lambda: vocab), scheduler_config=ns(max_num_seqs=max_num_seqs),
            num_speculative_tokens=0)
if "registry" in paths:
    registry = JitWarmupRegistry(config)
    with registry.activate():
        register_top_k_top_p_warmups()
    registry.warmup()

batches = sorted(set(range(1, 70)) | {100, max_num_seqs})
sampler = Sampler()
padded = -(-vocab // 64) * 64  # the LM head's rows are padded to 64 columns, then sliced to the vocab


def lm_head(b, dtype):
    return torch.empty((b, padded), dtype=dtype, device="cuda")[:, :vocab]


with fake_cuda():
    for b in batches:
        for use_k, use_p in ((True, False), (False, True), (True, True)):
            def full(v, b=b):
                return torch.full((b,), v, device="cuda")
            md = SamplingMetadata(
                temperature=full(0.5), all_greedy=False, all_random=False, top_p=full(0.9) if use_p else None,
                top_k=full(vocab - 1) if use_k else None, generators={0: torch.Generator().manual_seed(0)},
                max_num_logprobs=None, logprob_token_ids=None, no_penalties=True, prompt_token_ids=None,
                frequency_penalties=full(0.1), presence_penalties=full(0.1), repetition_penalties=full(0.1),
                output_token_ids=[[] for _ in range(b)], spec_token_ids=[[] for _ in range(b)],
                allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
            if "mrv1" in paths:
                sampler(logits=lm_head(b, torch.float32), sampling_metadata=md)
            if "mrv2" not in paths:
                continue
            # MRV2 seeded: fp32 copy, temperature, min-p, top-k/top-p, Gumbel (v1/worker/gpu/sample/sampler.py)
            logits = torch.empty_like(lm_head(b, torch.bfloat16), dtype=torch.float32)
            idx = torch.arange(b, dtype=torch.int64, device="cuda")
            temp = torch.full((max_num_seqs,), 0.7, dtype=torch.float32, device="cuda")
            apply_temperature(logits, idx, temp)
            apply_min_p(logits, idx, torch.full((max_num_seqs,), 0.1, dtype=torch.float32, device="cuda"))
            k = torch.full((max_num_seqs,), 50, dtype=torch.int32, device="cuda")[idx] if use_k else None
            p = torch.full((max_num_seqs,), 0.9, dtype=torch.float32, device="cuda")[idx] if use_p else None
            logits = apply_top_k_top_p(logits, k, p, has_topp_only_rows=use_p and not use_k)
            seeds = torch.full((max_num_seqs,), 7, dtype=torch.int64, device="cuda")
            gumbel_sample(logits, idx, temp, seeds, torch.zeros(b, dtype=torch.int64, device="cuda"),
                          apply_temperature=False, is_drafting=False)
            # MRV2 greedy / unprocessed requests: the raw fp32 LM-head logits, temperature inside the kernel
            gumbel_sample(lm_head(b, torch.float32), idx, temp, seeds, torch.zeros(b, dtype=torch.int64, device="cuda"),
                          apply_temperature=True, is_drafting=False)
probe_target.report(events)
