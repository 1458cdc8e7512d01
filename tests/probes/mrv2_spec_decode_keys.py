"""Independent probe: the Triton keys Model Runner V2's speculative decoding (EAGLE / EAGLE-3) asks for.

Written without kernelcache's exercise driver (only its fake driver, fake CUDA tensors, the runner's fake CUDA
runtime calls, exercise/fake_runner_ops.py, and fake_ops' import shims: "the same fake target"): its own
minimal CUDA platform and its own construction of vLLM 0.33's MRV2 objects with drafts (RequestState with k
draft slots, the Sampler for k + 1 logits per request, the RejectionSampler, the EAGLE speculator with its
draft model's forward and logits replaced by fresh tensors), driven over a seeded random sweep unlike the
exercise's: 1..MAX_NUM_SEQS requests with prompts of 1..40 tokens (chunked or not), each greedy or sampled
(random temperature, top-k, top-p, min-p, penalties, bias, bad words, seeds, logprobs), a first step that
prefills, then 1..3 steps where each request verifies 0..k drafts or keeps prefilling, with new requests
joining, a random number of accepted drafts, bf16 or fp32 logits, structured output or not. Prints one JSON
line per compile() call: {"name", "key", "hit"}.

    python mrv2_spec_decode_keys.py CAPABILITY SM_COUNT VOCAB MAX_NUM_SEQS K MAX_MODEL_LEN MAX_TOKENS ROUNDS [METHOD]
"""

import random
import sys
from types import SimpleNamespace

import probe_target  # this folder: the fake target, a CUDA platform, the compile log

capability, sm_count, vocab, seqs, k, max_len, max_tokens, rounds = map(int, sys.argv[1:9])
method = sys.argv[9] if len(sys.argv) > 9 else "eagle3"
events = probe_target.start(capability, sm_count)

from kernelcache.exercise import fake_ops  # noqa: E402

fake_ops.install_import_shims()
for op in fake_ops.OPS:
    if op.name == "cutlass_scaled_mm_supports_block_fp8" and not fake_ops._present(op):
        fake_ops._register(op)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.torch_utils import async_tensor_h2d  # noqa: E402
from vllm.v1.worker.gpu import input_batch as ib  # noqa: E402
from vllm.v1.worker.gpu.block_table import BlockTables  # noqa: E402
from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker  # noqa: E402
from vllm.v1.worker.gpu.sample.sampler import Sampler  # noqa: E402
from vllm.v1.worker.gpu.spec_decode import speculator as base  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import TargetDependentARSpeculator  # noqa: E402
from vllm.v1.worker.gpu.states import RequestState  # noqa: E402
from vllm.v1.worker.gpu.structured_outputs import StructuredOutputsWorker, grammar_invalid_drafts  # noqa: E402

from kernelcache.exercise.fake_device import fake_cuda  # noqa: E402
from kernelcache.exercise.fake_runner_ops import runner_ops  # noqa: E402

rng = random.Random(20261205)
padded = -(-vocab // 64) * 64
cuda = torch.device("cuda")
BLOCK, HIDDEN = 16, 2048
WIDTH = (max_len + BLOCK * 8 - 1) // (BLOCK * 8) * 8  # cdiv(max_len, 16) aligned to 128 tokens


class RealCpu(TorchFunctionMode):
    """Torch calls on real CPU tensors only stay real (the runner's host-side reads)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        vals = (*args, *kwargs.values())
        ts = [a for a in vals if isinstance(a, torch.Tensor)]
        if ts and all(not isinstance(t, FakeTensor) and t.device.type == "cpu" for t in ts) and not any(
                isinstance(a, (str, torch.device)) and str(a).startswith("cuda") for a in vals):
            with torch.utils._python_dispatch._disable_current_modes():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def real(array):
    with torch.utils._python_dispatch._disable_current_modes():
        return torch.from_numpy(array)


def logits_of(rows, dtype):
    return torch.empty((rows, padded), dtype=dtype, device=cuda)[:, :vocab]


def hidden(rows, dtype):
    return torch.empty((rows, HIDDEN), dtype=dtype, device=cuda)


def vllm_config(dtype):
    draft = SimpleNamespace(get_hidden_size=lambda: HIDDEN, get_vocab_size=lambda: vocab, hf_config=None)
    spec = SimpleNamespace(method=method, num_speculative_tokens=k, draft_model_config=draft,
                           draft_sample_method="greedy", rejection_sample_method="standard",
                           fly_entropy_threshold=0.3, fly_entropy_top_k=3, fly_window_size=None,
                           synthetic_acceptance_rates=None, enable_adaptive_verification=False,
                           use_local_argmax_reduction=False, uses_dynamic_speculative_decoding=lambda: False)
    return SimpleNamespace(speculative_config=spec, reasoning_config=None, watermark_config=None,
                           scheduler_config=SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=max_tokens),
                           model_config=SimpleNamespace(max_model_len=max_len, dtype=dtype, head_dtype=dtype,
                                                        use_fp64_gumbel=False),
                           parallel_config=SimpleNamespace(data_parallel_size=1, data_parallel_rank=0,
                                                           decode_context_parallel_size=1))


class Eagle(TargetDependentARSpeculator):
    def load_draft_model(self, target_model, names):
        return None


def speculator(cfg, bt, dtype):
    saved, base._target_feeds_hc_residual = base._target_feeds_hc_residual, lambda c: False
    try:
        sp = Eagle(cfg, cuda)
    finally:
        base._target_feeds_hc_residual = saved
    sp.model = SimpleNamespace(combine_hidden_states=lambda h: hidden(h.shape[0], dtype),
                               compute_logits=lambda h: logits_of(h.shape[0], dtype))
    sp._run_model = lambda n, *a, **kw: (hidden(n, dtype), hidden(n, dtype))
    sp._build_uniform_attn_metadata = lambda **kw: None
    sp.block_tables = bt
    sp.kv_cache_config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=["d"])])
    return sp


def params():
    n = rng.randint(0, 20)
    if rng.random() < 0.35:
        return SamplingParams(temperature=0.0, logprobs=n if rng.random() < 0.5 else None,
                              prompt_logprobs=n if rng.random() < 0.2 else None)
    sp = SamplingParams(temperature=rng.choice([0.5, 1.0]), top_k=rng.choice([-1, 20]), top_p=rng.choice([1.0, 0.8]),
                        min_p=rng.choice([0.0, 0.05]), seed=rng.choice([None, rng.randint(0, 99)]),
                        presence_penalty=rng.choice([0.0, 0.5]), logit_bias={3: 1.0} if rng.random() < 0.3 else None,
                        min_tokens=rng.choice([0, 2]), logprobs=n if rng.random() < 0.5 else None,
                        prompt_logprobs=n if rng.random() < 0.2 else None)
    sp._bad_words_token_ids = [[7]] if rng.random() < 0.3 else []
    sp._all_stop_token_ids = {2}
    return sp


def add(st, i, length):
    sp = params()
    st.rs.add_request(f"r{i}", length, list(range(length)), 0, 32)
    index = st.rs.req_id_to_index[f"r{i}"]
    per = (length + 8 * (k + 1) + BLOCK - 1) // BLOCK
    st.bt.append_block_ids(index, ([1 + index * per + j for j in range(per)],), overwrite=True)
    st.sampler.add_request(index, sp)
    st.pl.add_request(f"r{i}", index, sp)
    return index


def inputs(st, idx, sched, drafts):
    n, total = len(idx), int(sched.sum())
    idx_t = async_tensor_h2d(idx, device=cuda, dtype=torch.int64)
    if drafts.any():
        cu_np = np.concatenate([[0], np.cumsum(drafts + 1)]).astype(np.int32)
        cu = async_tensor_h2d(cu_np, device=cuda)
    else:
        cu_np, cu = np.arange(n + 1, dtype=np.int32), torch.arange(n + 1, device=cuda, dtype=torch.int32)
    n_logits = int(cu_np[-1])
    qsl_np = np.full(seqs + 1, total, dtype=np.int32)
    qsl_np[0] = 0
    np.cumsum(sched, out=qsl_np[1:n + 1])
    async_tensor_h2d(qsl_np, out=st.buf.query_start_loc)
    qsl = st.buf.query_start_loc[:n + 1]
    if drafts.any():
        exp, loc = ib.expand_idx_mapping(idx_t, n_logits, cu, k + 1)
    else:
        exp, loc = idx_t, torch.zeros(n, dtype=torch.int32, device=cuda)
    rs = st.rs
    comp, plen = rs.num_computed_tokens_np[idx], rs.prefill_len.np[idx]
    if (comp < plen).any():
        ib.prepare_prefill_inputs(st.buf.input_ids, rs.next_prefill_tokens, idx_t, qsl, rs.all_token_ids.gpu,
                                  rs.prefill_len.gpu, rs.num_computed_tokens.gpu)
    ib.prepare_pos_seq_lens(idx_t, qsl, rs.num_computed_tokens.gpu, st.buf.positions, st.buf.seq_lens)
    li = ib.combine_sampled_and_draft_tokens(st.buf.input_ids, idx_t, rs.last_sampled_tokens, qsl,
                                             st.buf.seq_lens[:n], rs.prefill_len.gpu, rs.draft_tokens, cu, n_logits)
    return ib.InputBatch(
        req_ids=[rs.index_to_req_id[int(i)] for i in idx], num_reqs=n, num_reqs_after_padding=n, idx_mapping=idx_t,
        idx_mapping_np=idx, expanded_idx_mapping=exp, expanded_local_pos=loc, num_scheduled_tokens=sched,
        num_tokens=total, num_tokens_after_padding=total, num_draft_tokens=int(drafts.sum()),
        num_draft_tokens_per_req=drafts if drafts.any() else None, query_start_loc=qsl,
        query_start_loc_np=qsl_np[:n + 1], seq_lens=st.buf.seq_lens[:n],
        seq_lens_cpu_upper_bound=real((comp + sched).astype(np.int32)), dcp_local_seq_lens=None,
        num_computed_tokens_np=comp, prefill_len_np=plen, num_computed_prefill_tokens_np=comp.copy(),
        is_prefilling_np=comp < plen, has_prefill=bool((comp < plen).any()),
        decode_graph_eligible=not (comp < plen).any(), input_ids=st.buf.input_ids[:total],
        positions=st.buf.positions[:total], is_padding=st.buf.is_padding[:total], logits_indices=li,
        cu_num_logits=cu, cu_num_logits_np=cu_np, has_structured_output_reqs=False, prompt_lens=None)


def one_step(st, idx, sched, drafts, dtype, structured):
    batch = inputs(st, idx, sched, drafts)
    st.bt.gather_block_tables(batch.idx_mapping, num_reqs_padded=batch.num_reqs,
                              num_computed_tokens=st.rs.num_computed_tokens.gpu)
    st.bt.compute_slot_mappings(batch.idx_mapping, batch.query_start_loc, batch.positions, batch.num_tokens)
    logits = logits_of(int(batch.cu_num_logits_np[-1]), dtype)
    invalid = None
    if structured:
        mask = np.full((batch.num_reqs * (k + 1), (vocab + 31) // 32), -1, dtype=np.int32)
        st.so.apply_grammar_bitmask(logits, batch, batch.req_ids, mask)
        invalid = grammar_invalid_drafts(batch, batch.req_ids, [rng.randint(0, k) for _ in batch.req_ids])
    drafted = batch.num_draft_tokens > 0
    out = st.rej(logits, batch, st.sp.draft_logits, invalid) if drafted else st.sampler(logits, batch)
    h = hidden(batch.num_tokens, torch.bfloat16)
    if batch.has_prefill:
        st.pl.compute_prompt_logprobs(lambda x: logits_of(x.shape[0], dtype), h, batch, st.rs.all_token_ids.gpu,
                                      st.rs.num_computed_tokens.gpu, st.rs.prompt_len.np)
    rs = st.rs
    ib.post_update(batch.idx_mapping, rs.num_computed_tokens.gpu, rs.last_sampled_tokens,
                   st.sampler.penalties_state.output_bin_counts, out.sampled_token_ids, out.num_sampled,
                   out.num_rejected, batch.query_start_loc, rs.all_token_ids.gpu, rs.total_len.gpu, None,
                   rs.draft_tokens)
    aux = [hidden(batch.num_tokens, torch.bfloat16) for _ in range(3)] if method == "eagle3" else None
    new = st.sp.propose(batch, None, None, h, aux, out.num_sampled, out.num_rejected, rs.last_sampled_tokens,
                        rs.next_prefill_tokens, st.sampler.sampling_states.temperature.gpu,
                        st.sampler.sampling_states.seeds.gpu, is_profile=True)
    rs.draft_tokens[batch.idx_mapping] = new
    accepted = np.array([rng.randint(0, int(d)) for d in drafts], dtype=np.int32)  # the scheduler's view
    rs.num_computed_tokens_np[idx] += sched - (drafts - accepted)


def stage(st):
    st.rs.apply_staged_writes()
    st.sampler.apply_staged_writes()
    st.bt.apply_staged_writes()


def one_round():
    dtype = rng.choice([torch.bfloat16, torch.float32])  # the logits'; the model (and drafter) is bf16
    cfg = vllm_config(torch.bfloat16)
    rs = RequestState(seqs, max_len, max_tokens, k, vocab, cuda)
    bt = BlockTables([BLOCK], seqs, max_tokens, [WIDTH], cuda)
    sampler = Sampler(cfg, seqs, vocab, cuda, rs, num_speculative_tokens=k + 1)
    st = SimpleNamespace(rs=rs, bt=bt, buf=ib.InputBuffers(seqs, max_tokens, cuda), sampler=sampler,
                         rej=RejectionSampler(sampler, cfg.speculative_config, cuda),
                         sp=speculator(cfg, bt, torch.bfloat16),
                         pl=PromptLogprobsWorker(seqs, cuda), so=StructuredOutputsWorker(seqs * (k + 1), vocab, cuda,
                                                                                       k + 1))
    n = rng.randint(1, seqs)
    lens = [rng.randint(1, max(1, min(40, max_tokens // (n + 1)))) for _ in range(n)]
    idx = np.array([add(st, i, lens[i]) for i in range(n)], dtype=np.intp)
    stage(st)
    one_step(st, idx, np.array(lens, dtype=np.int32), np.zeros(n, dtype=np.int32), dtype, rng.random() < 0.4)
    joined = n
    for _ in range(rng.randint(1, 3)):
        keep = idx[: rng.randint(1, len(idx))]
        extra = []
        if joined < seqs and rng.random() < 0.5:  # a new request joins with a (possibly chunked) prefill
            length = rng.randint(2, 30)
            extra = [add(st, joined, length)]
            joined += 1
            stage(st)
        drafts = np.array([rng.randint(0, k) for _ in keep] + [0] * len(extra), dtype=np.int32)
        sched = np.array([d + 1 for d in drafts[: len(keep)]] + [rng.randint(1, st.rs.prefill_len.np[e])
                                                                  for e in extra], dtype=np.int32)
        if int(sched.sum()) > max_tokens:
            break
        idx = np.concatenate([keep, np.array(extra, dtype=np.intp)]).astype(np.intp)
        one_step(st, idx, sched, drafts, dtype, rng.random() < 0.3)


with fake_cuda(), runner_ops(True), RealCpu():
    for _ in range(rounds):
        one_round()
probe_target.report(events)
