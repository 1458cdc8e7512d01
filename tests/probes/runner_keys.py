"""Independent probe: the Triton keys Model Runner V2's own kernels ask for, under the fake target.

Written without kernelcache's exercise driver (only its fake driver, fake CUDA tensors and the runner's fake
CUDA runtime calls, exercise/fake_runner_ops.py: "the same fake target"): its own minimal CUDA platform, and
vLLM 0.33's MRV2 objects (RequestState, InputBuffers, BlockTables, the MRV2 Sampler, prompt logprobs, the
grammar bitmask) driven over a seeded random sweep unlike the exercise's: batches of 1..MAX_NUM_SEQS requests,
prompts of 1..64 tokens, each request greedy or sampled (random temperature, top-k, top-p, min-p, penalties,
logit bias, bad words, min tokens, seeds), random logprobs / prompt logprobs in 0..20, bf16 or fp32 logits,
a prefill step then 1..3 decode steps, structured output or not. Prints one JSON line per compile() call:
{"name", "key", "hit"}.

    python runner_keys.py CAPABILITY SM_COUNT VOCAB MAX_NUM_SEQS MAX_MODEL_LEN MAX_NUM_BATCHED_TOKENS ROUNDS
"""

import random
import sys
from types import SimpleNamespace

import probe_target  # this folder: the fake target, a CUDA platform, the compile log

capability, sm_count, vocab, seqs, max_len, max_tokens, rounds = map(int, sys.argv[1:8])
events = probe_target.start(capability, sm_count)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.torch_utils import async_tensor_h2d  # noqa: E402
from vllm.v1.worker.gpu import input_batch as ib  # noqa: E402
from vllm.v1.worker.gpu.block_table import BlockTables  # noqa: E402
from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker  # noqa: E402
from vllm.v1.worker.gpu.sample.sampler import Sampler  # noqa: E402
from vllm.v1.worker.gpu.states import RequestState  # noqa: E402
from vllm.v1.worker.gpu.structured_outputs import StructuredOutputsWorker  # noqa: E402

from kernelcache.exercise.fake_device import fake_cuda  # noqa: E402
from kernelcache.exercise.fake_runner_ops import runner_ops  # noqa: E402

rng = random.Random(20261204)
padded = -(-vocab // 64) * 64
cuda = torch.device("cuda")
BLOCK = 16
WIDTH = (max_len + BLOCK * 8 - 1) // (BLOCK * 8) * 8  # cdiv(max_len, 16) aligned to 128 tokens (kv_cache_interface.py)


def real(array):
    with torch.utils._python_dispatch._disable_current_modes():
        return torch.from_numpy(array)


def logits_of(rows, dtype):
    return torch.empty((rows, padded), dtype=dtype, device=cuda)[:, :vocab]


def params():
    n, p = rng.randint(0, 20), rng.randint(0, 20)
    if rng.random() < 0.3:
        return SamplingParams(temperature=0.0, logprobs=n if rng.random() < 0.5 else None,
                              prompt_logprobs=p if rng.random() < 0.3 else None)
    sp = SamplingParams(temperature=rng.choice([0.5, 1.0, 1.3]), top_k=rng.choice([-1, 20, 100]),
                        top_p=rng.choice([1.0, 0.8]), min_p=rng.choice([0.0, 0.05]), seed=rng.randint(0, 99),
                        frequency_penalty=rng.choice([0.0, 0.3]), repetition_penalty=rng.choice([1.0, 1.1]),
                        logit_bias={5: 1.0} if rng.random() < 0.5 else None, min_tokens=rng.choice([0, 3]),
                        logprobs=n if rng.random() < 0.5 else None, prompt_logprobs=p if rng.random() < 0.3 else None)
    sp._bad_words_token_ids = [[7], [8, 9]] if rng.random() < 0.5 else []
    sp._all_stop_token_ids = {2}
    return sp


def inputs(st, idx, sched, prefill):
    n, total = len(idx), int(sched.sum())
    idx_t = async_tensor_h2d(idx, device=cuda, dtype=torch.int64)
    qsl_np = np.empty(seqs + 1, dtype=np.int32)
    qsl_np[0] = 0
    np.cumsum(sched, out=qsl_np[1:n + 1])
    qsl_np[n + 1:] = total
    async_tensor_h2d(qsl_np, out=st.buf.query_start_loc)
    qsl = st.buf.query_start_loc[:n + 1]
    rs = st.rs
    if prefill:
        ib.prepare_prefill_inputs(st.buf.input_ids, rs.next_prefill_tokens, idx_t, qsl, rs.all_token_ids.gpu,
                                  rs.prefill_len.gpu, rs.num_computed_tokens.gpu)
    ib.prepare_pos_seq_lens(idx_t, qsl, rs.num_computed_tokens.gpu, st.buf.positions, st.buf.seq_lens)
    cu = torch.arange(n + 1, device=cuda, dtype=torch.int32)
    li = ib.combine_sampled_and_draft_tokens(st.buf.input_ids, idx_t, rs.last_sampled_tokens, qsl,
                                             st.buf.seq_lens[:n], rs.prefill_len.gpu, rs.draft_tokens, cu, n)
    comp = rs.num_computed_tokens_np[idx]
    return ib.InputBatch(
        req_ids=[rs.index_to_req_id[int(i)] for i in idx], num_reqs=n, num_reqs_after_padding=n, idx_mapping=idx_t,
        idx_mapping_np=idx, expanded_idx_mapping=idx_t, expanded_local_pos=torch.zeros(n, dtype=torch.int32,
                                                                                        device=cuda),
        num_scheduled_tokens=sched, num_tokens=total, num_tokens_after_padding=total, num_draft_tokens=0,
        num_draft_tokens_per_req=None, query_start_loc=qsl, query_start_loc_np=qsl_np[:n + 1],
        seq_lens=st.buf.seq_lens[:n], seq_lens_cpu_upper_bound=real((comp + sched).astype(np.int32)),
        dcp_local_seq_lens=None, num_computed_tokens_np=comp, prefill_len_np=rs.prefill_len.np[idx],
        num_computed_prefill_tokens_np=comp.copy(), is_prefilling_np=comp < rs.prefill_len.np[idx],
        has_prefill=prefill, decode_graph_eligible=not prefill, input_ids=st.buf.input_ids[:total],
        positions=st.buf.positions[:total], is_padding=st.buf.is_padding[:total], logits_indices=li, cu_num_logits=cu,
        cu_num_logits_np=np.arange(n + 1, dtype=np.int32), has_structured_output_reqs=False, prompt_lens=None)


def one_step(st, idx, sched, prefill, dtype, structured):
    batch = inputs(st, idx, sched, prefill)
    st.bt.gather_block_tables(batch.idx_mapping, num_reqs_padded=batch.num_reqs,
                              num_computed_tokens=st.rs.num_computed_tokens.gpu)
    st.bt.compute_slot_mappings(batch.idx_mapping, batch.query_start_loc, batch.positions, batch.num_tokens)
    logits = logits_of(batch.num_reqs, dtype)
    if structured:
        mask = np.full((batch.num_reqs, (vocab + 31) // 32), -1, dtype=np.int32)
        st.so.apply_grammar_bitmask(logits, batch, batch.req_ids, mask)
    out = st.sampler(logits, batch)
    if prefill:
        st.pl.compute_prompt_logprobs(lambda h: logits_of(h.shape[0], dtype),
                                      torch.empty((batch.num_tokens, 8), dtype=dtype, device=cuda), batch,
                                      st.rs.all_token_ids.gpu, st.rs.num_computed_tokens.gpu, st.rs.prompt_len.np)
    rs = st.rs
    ib.post_update(batch.idx_mapping, rs.num_computed_tokens.gpu, rs.last_sampled_tokens,
                   st.sampler.penalties_state.output_bin_counts, out.sampled_token_ids, out.num_sampled,
                   out.num_rejected, batch.query_start_loc, rs.all_token_ids.gpu, rs.total_len.gpu, None,
                   rs.draft_tokens)
    rs.num_computed_tokens_np[idx] += sched


def one_round():
    rs = RequestState(seqs, max_len, max_tokens, 0, vocab, cuda)
    st = SimpleNamespace(rs=rs, buf=ib.InputBuffers(seqs, max_tokens, cuda),
                         bt=BlockTables([BLOCK], seqs, max_tokens, [WIDTH], cuda),
                         sampler=Sampler(SimpleNamespace(reasoning_config=None), seqs, vocab, cuda, rs),
                         pl=PromptLogprobsWorker(seqs, cuda), so=StructuredOutputsWorker(seqs, vocab, cuda, 1))
    n = rng.randint(1, seqs)
    lens = [rng.randint(1, max(1, min(64, max_tokens // n))) for _ in range(n)]
    for i, length in enumerate(lens):
        sp = params()
        rs.add_request(f"r{i}", length, list(range(length)), 0, 16)
        index = rs.req_id_to_index[f"r{i}"]
        st.bt.append_block_ids(index, ([1 + index * 5 + j for j in range(5)],), overwrite=True)
        st.sampler.add_request(index, sp)
        st.pl.add_request(f"r{i}", index, sp)
    rs.apply_staged_writes()
    st.sampler.apply_staged_writes()
    st.bt.apply_staged_writes()
    idx = np.array([rs.req_id_to_index[f"r{i}"] for i in range(n)], dtype=np.intp)
    dtype = rng.choice([torch.bfloat16, torch.float32])
    one_step(st, idx, np.array(lens, dtype=np.int32), True, dtype, rng.random() < 0.5)
    for _ in range(rng.randint(1, 3)):
        keep = idx[: rng.randint(1, n)]
        one_step(st, keep, np.ones(len(keep), dtype=np.int32), False, dtype, False)


with fake_cuda(), runner_ops(True):
    for _ in range(rounds):
        one_round()
probe_target.report(events)
