"""Drive Model Runner V2's own Triton kernels, as its engine-start warmup and its serving steps launch them.

vLLM 0.33's default runner compiles its kernels lazily; its warmup (``warmup_kernels``) runs real prefill and
decode steps that no GPU-less build can run, and the JIT warmup registry holds none of them. So ``runner`` builds
the runner's own state objects with its constructor arguments (``RequestState``, ``InputBuffers``,
``BlockTables``, MRV2's ``Sampler``, ``PromptLogprobsWorker``, ``StructuredOutputsWorker``) and replays its step
sequence as ``GPUModelRunner.execute_model`` / ``sample_tokens`` order it: staged writes, ``prepare_inputs``,
``prepare_attn``, the grammar bitmask, the sampler, prompt logprobs, ``post_update``.

Triton specializes here on the logits dtype and row stride (batch classes 1 and > 1), the top-k/top-p batch
classes (``drivers.batch_classes``), the logprobs count (``logprob_classes``) and buffer strides fixed by
the config; batch and prefill lengths only size grids, so prompts are short. In cross mode the CUDA runtime calls
on the way are faked by exercise/fake_runner_ops.py (listed in the summary). What is not driven: docs/FAMILIES.md,
"runner".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..plan.families.runner import CONTACTS
from ..plan.releases import resolve
from .drivers import batch_classes, cross, device_scope, model_logits, require_triton, sm_count
from .fake_runner_ops import runner_ops
from .watch import seen

PROMPT_LEN = 3  # warmup.py uses decode_query_len + 1 tokens: a prefill that is not a uniform decode
MAX_LOGPROBS = 20  # vllm/config/model.py ModelConfig.max_logprobs default
TOKEN_ALIGNMENT = 128  # vllm/v1/kv_cache_interface.py AttentionSpec.block_table_token_alignment
# Batch mixes: every sampler feature with top-k and top-p on every row, top-k only, top-p only, top-p-only
# rows among top-k ones (``has_topp_only_rows``: the split top-p pipeline), and all greedy.
MIXES = ("top_k_top_p", "top_k", "top_p", "mixed", "greedy")


def runner(vocab: int, max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int, block_size: int = 16,
           dtypes: list[str] | None = None, max_logprobs: int = MAX_LOGPROBS) -> dict:
    """Every batch class x logits dtype through a prefill and a decode step, then every logprobs class."""
    require_triton()
    dtypes = dtypes or ["bfloat16"]
    batches = [b for b in batch_classes(vocab, max_num_seqs, sm_count())
               if b * PROMPT_LEN <= max_num_batched_tokens]
    calls: Counter = Counter()
    with device_scope(), runner_ops(cross()) as substituted:
        config = Config(vocab, max_num_seqs, max_model_len, max_num_batched_tokens, block_size)
        for dtype in dtypes:
            for batch in batches:
                for mode in MIXES:
                    run_requests(config, dtype, batch, mode, num_logprobs=5)
                    calls[f"{dtype}:{mode}"] += 1
            for k in logprob_classes(max_logprobs, vocab):
                run_requests(config, dtype, 1, "greedy", num_logprobs=k)
                calls[f"{dtype}:logprobs"] += 1
    return {"batch_sizes": batches, "logprobs": logprob_classes(max_logprobs, vocab), "calls": dict(calls),
            "substituted": substituted}


@dataclass(frozen=True)
class Config:
    vocab: int
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    block_size: int

    @property
    def max_num_blocks(self) -> int:
        """``GPUModelRunner.initialize_kv_cache``'s block-table width for one full-attention group."""
        return block_table_width(self.max_model_len, self.block_size)


def block_table_width(max_model_len: int, block_size: int) -> int:
    """``GPUModelRunner.initialize_kv_cache``'s block-table width for one full-attention group, through the
    installed release's ``get_block_table_width`` (plan/families/runner.py names where it lives)."""
    from vllm.utils.math_utils import cdiv

    width = resolve(CONTACTS, "get_block_table_width")
    return width(cdiv(max_model_len, block_size), block_size, token_alignment=TOKEN_ALIGNMENT)


def logprob_classes(max_logprobs: int, vocab: int) -> list[int]:
    """One ``logprobs=k`` per distinct key of the logprob kernels: ``k + 1`` columns reach
    ``_topk_log_softmax_kernel`` as an int (==1, %16) and as ``TOPK_BLOCK_SIZE`` (next power of two,
    capped at 1024; vllm/v1/worker/gpu/sample/logprob.py). ``max_logprobs == -1`` allows the whole vocab."""
    from vllm.triton_utils import triton

    top = vocab if max_logprobs == -1 else max_logprobs
    seen, picks = set(), []
    for k in range(0, top + 1):
        cls = (k + 1 == 1, (k + 1) % 16 == 0, min(triton.next_power_of_2(k + 1), 1024))
        if cls not in seen:
            seen.add(cls)
            picks.append(k)
    return picks


@dataclass
class Runner:
    """The state objects ``GPUModelRunner`` builds (model_runner.py ``__init__``, ``load_model``,
    ``initialize_kv_cache``), with its arguments for a non-speculative, single-group, last-PP-rank runner."""

    config: Config
    req_states: Any
    input_buffers: Any
    block_tables: Any
    sampler: Any
    prompt_logprobs: Any
    structured_outputs: Any

    @classmethod
    def build(cls, config: Config) -> Runner:
        import torch
        from vllm.v1.worker.gpu.block_table import BlockTables
        from vllm.v1.worker.gpu.input_batch import InputBuffers
        from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker
        from vllm.v1.worker.gpu.sample.sampler import Sampler
        from vllm.v1.worker.gpu.states import RequestState
        from vllm.v1.worker.gpu.structured_outputs import StructuredOutputsWorker

        device = torch.device("cuda")
        seqs = config.max_num_seqs
        req_states = RequestState(max_num_reqs=seqs, max_model_len=config.max_model_len,
                                  max_num_batched_tokens=config.max_num_batched_tokens, num_speculative_steps=0,
                                  vocab_size=config.vocab, device=device, num_prefill_lookahead=1)
        block_tables = BlockTables(block_sizes=[config.block_size], max_num_reqs=seqs,
                                   max_num_batched_tokens=config.max_num_batched_tokens,
                                   max_num_blocks_per_group=[config.max_num_blocks], device=device,
                                   slot_mapping_enabled=[True], dcp_sharded=[True], sliding_window_reach=[0])
        sampler = Sampler(vllm_config=_sampler_config(), max_num_reqs=seqs, vocab_size=config.vocab, device=device,
                          req_states=req_states, logprobs_mode="raw_logprobs", num_speculative_tokens=1)
        return cls(config, req_states, InputBuffers(seqs, config.max_num_batched_tokens, device), block_tables,
                   sampler, PromptLogprobsWorker(seqs, device, logprobs_mode="raw_logprobs"),
                   StructuredOutputsWorker(max_num_logits=seqs, vocab_size=config.vocab, device=device, mask_stride=1))


def _sampler_config() -> Any:
    """What MRV2's ``Sampler`` and its logits processors read of the ``VllmConfig``: no reasoning config."""
    from types import SimpleNamespace

    return SimpleNamespace(reasoning_config=None)


def sampling_params(mode: str, row: int, num_logprobs: int) -> Any:
    """Row ``row`` of a batch ``mode`` (``MIXES``): ``for_sampler_warmup()`` (every sampler feature) with a
    seed and the mode's top-k / top-p, or a greedy request; logprobs and prompt logprobs on every row.

    Seeded: a seeded batch is never eligible for FlashInfer's fused sampler (sampler.py ``sample``), so the
    Triton top-k/top-p and Gumbel kernels run wherever FlashInfer is installed. Watermarking is off (it needs
    the runner's ``watermark_config``); a stop token makes ``min_tokens`` reach the bias kernel."""
    from vllm.sampling_params import SamplingParams

    if mode == "greedy":
        return SamplingParams(temperature=0.0, logprobs=num_logprobs, prompt_logprobs=num_logprobs)
    params = SamplingParams.for_sampler_warmup()
    params.seed, params.watermarking, params.logprobs = row, False, num_logprobs
    params.prompt_logprobs = num_logprobs
    params._all_stop_token_ids = {2}
    if mode == "top_k":
        params.top_p = 1.0
    elif mode == "top_p" or (mode == "mixed" and row == 0):
        params.top_k = 0  # SamplingStates.add_request: 0 means the whole vocab
    return params


def run_requests(config: Config, dtype: str, batch: int, mode: str, num_logprobs: int) -> None:
    """``batch`` new requests: one prefill step (grammar bitmask, prompt logprobs), one decode step."""
    runner_state = Runner.build(config)
    req_ids = [f"req-{i}" for i in range(batch)]
    for i, req_id in enumerate(req_ids):
        add_request(runner_state, req_id, sampling_params(mode, i, num_logprobs))
    apply_staged_writes(runner_state)
    indices = [runner_state.req_states.req_id_to_index[r] for r in req_ids]
    step(runner_state, dtype, indices, [PROMPT_LEN] * batch, prefill=True)
    for index in indices:  # update_requests: the scheduler's num_computed_tokens for the decode step
        runner_state.req_states.num_computed_tokens_np[index] = PROMPT_LEN
    step(runner_state, dtype, indices, [1] * batch, prefill=False)


def add_request(runner_state: Runner, req_id: str, params: Any) -> None:
    """``GPUModelRunner.add_requests`` for one new request with a ``PROMPT_LEN``-token prompt."""
    from vllm.utils.math_utils import cdiv

    config = runner_state.config
    prompt = list(range(PROMPT_LEN))
    runner_state.req_states.add_request(req_id=req_id, prompt_len=PROMPT_LEN, all_token_ids=prompt,
                                        num_computed_tokens=0, max_tokens=params.max_tokens)
    index = runner_state.req_states.req_id_to_index[req_id]
    blocks = cdiv(PROMPT_LEN + 1, config.block_size)
    runner_state.block_tables.append_block_ids(index, (list(range(1 + index * blocks, 1 + (index + 1) * blocks)),),
                                               overwrite=True)
    runner_state.sampler.add_request(index, params)
    runner_state.prompt_logprobs.add_request(req_id, index, params)


def apply_staged_writes(runner_state: Runner) -> None:
    """``add_requests`` then ``execute_model``'s order: request state, sampler, block tables."""
    runner_state.req_states.apply_staged_writes()
    runner_state.sampler.apply_staged_writes()
    runner_state.block_tables.apply_staged_writes()


def step(runner_state: Runner, dtype: str, indices: list[int], scheduled: list[int], prefill: bool) -> None:
    """One ``execute_model`` + ``sample_tokens``: inputs, attention metadata, bitmask, sampling, post-update."""
    import numpy as np
    import torch
    from vllm.v1.worker.gpu.input_batch import post_update

    batch = prepare_inputs(runner_state, np.array(indices, dtype=np.intp), np.array(scheduled, dtype=np.int32),
                           prefill)
    prepare_attn(runner_state, batch)
    logits = model_logits(batch.num_reqs, runner_state.config.vocab, getattr(torch, dtype))
    if prefill:  # warmup.py builds a GrammarOutput for the prefill step: every request structured
        bitmask = np.full((batch.num_reqs, (runner_state.config.vocab + 31) // 32), -1, dtype=np.int32)
        runner_state.structured_outputs.apply_grammar_bitmask(logits, batch, batch.req_ids, bitmask)
    seen("runner.sample", batch=batch)
    output = runner_state.sampler(logits, batch)
    seen("runner.sampled", output=output)
    if prefill:
        hidden = torch.empty((batch.num_tokens, 64), dtype=getattr(torch, dtype), device="cuda")
        runner_state.prompt_logprobs.compute_prompt_logprobs(
            lambda h: model_logits(h.shape[0], runner_state.config.vocab, getattr(torch, dtype)), hidden, batch,
            runner_state.req_states.all_token_ids.gpu, runner_state.req_states.num_computed_tokens.gpu,
            runner_state.req_states.prompt_len.np)
    req = runner_state.req_states
    post_update(batch.idx_mapping, req.num_computed_tokens.gpu, req.last_sampled_tokens,
                runner_state.sampler.penalties_state.output_bin_counts, output.sampled_token_ids, output.num_sampled,
                output.num_rejected, batch.query_start_loc, req.all_token_ids.gpu, req.total_len.gpu, None,
                req.draft_tokens)


def prepare_inputs(runner_state: Runner, idx_mapping_np: Any, scheduled: Any, prefill: bool) -> Any:
    """``GPUModelRunner.prepare_inputs`` without drafts, padding or adaptive verification (model_runner.py)."""
    import numpy as np
    import torch
    from vllm.utils.torch_utils import async_tensor_h2d
    from vllm.v1.worker.gpu.input_batch import (
        InputBatch,
        combine_sampled_and_draft_tokens,
        prepare_pos_seq_lens,
        prepare_prefill_inputs,
    )

    req, buffers = runner_state.req_states, runner_state.input_buffers
    num_reqs, num_tokens = len(idx_mapping_np), int(scheduled.sum())
    idx_mapping = async_tensor_h2d(idx_mapping_np, device=buffers.device, dtype=torch.int64)
    cu_num_logits_np = np.arange(num_reqs + 1, dtype=np.int32)
    cu_num_logits = torch.arange(num_reqs + 1, device=buffers.device, dtype=torch.int32)
    expanded_local_pos = torch.zeros(num_reqs, dtype=torch.int32, device=buffers.device)
    query_start_loc_np = np.empty(runner_state.config.max_num_seqs + 1, dtype=np.int32)
    query_start_loc_np[0] = 0
    np.cumsum(scheduled, out=query_start_loc_np[1:num_reqs + 1])
    query_start_loc_np[num_reqs + 1:] = num_tokens
    async_tensor_h2d(query_start_loc_np, out=buffers.query_start_loc)
    query_start_loc = buffers.query_start_loc[:num_reqs + 1]
    if prefill:
        prepare_prefill_inputs(buffers.input_ids, req.next_prefill_tokens, idx_mapping, query_start_loc,
                               req.all_token_ids.gpu, req.prefill_len.gpu, req.num_computed_tokens.gpu)
    prepare_pos_seq_lens(idx_mapping, query_start_loc, req.num_computed_tokens.gpu, buffers.positions,
                         buffers.seq_lens)
    seq_lens = buffers.seq_lens[:num_reqs]
    logits_indices = combine_sampled_and_draft_tokens(buffers.input_ids, idx_mapping, req.last_sampled_tokens,
                                                      query_start_loc, seq_lens, req.prefill_len.gpu,
                                                      req.draft_tokens, cu_num_logits, num_reqs, 1)
    computed = req.num_computed_tokens_np[idx_mapping_np]
    upper = host_tensor((computed + scheduled).astype(np.int32))
    prefill_len = req.prefill_len.np[idx_mapping_np]
    return InputBatch(
        req_ids=[req.index_to_req_id[int(i)] for i in idx_mapping_np], num_reqs=num_reqs,
        num_reqs_after_padding=num_reqs, idx_mapping=idx_mapping, idx_mapping_np=idx_mapping_np,
        expanded_idx_mapping=idx_mapping, expanded_local_pos=expanded_local_pos, num_scheduled_tokens=scheduled,
        num_tokens=num_tokens, num_tokens_after_padding=num_tokens, num_draft_tokens=0,
        num_draft_tokens_per_req=None, query_start_loc=query_start_loc,
        query_start_loc_np=query_start_loc_np[:num_reqs + 1], seq_lens=seq_lens, seq_lens_cpu_upper_bound=upper,
        dcp_local_seq_lens=None, num_computed_tokens_np=computed, prefill_len_np=prefill_len,
        num_computed_prefill_tokens_np=computed.copy(), is_prefilling_np=computed < prefill_len,
        has_prefill=prefill, decode_graph_eligible=not prefill,
        input_ids=buffers.input_ids[:num_tokens], positions=buffers.positions[:num_tokens],
        is_padding=buffers.is_padding[:num_tokens], logits_indices=logits_indices, cu_num_logits=cu_num_logits,
        cu_num_logits_np=cu_num_logits_np, has_structured_output_reqs=prefill, prompt_lens=None)


def host_tensor(array: Any) -> Any:
    """``torch.from_numpy``: a real CPU tensor, as on the GPU machine (FakeTensorMode would lift it)."""
    import torch

    with torch.utils._python_dispatch._disable_current_modes():
        return torch.from_numpy(array)


def prepare_attn(runner_state: Runner, batch: Any) -> None:
    """``GPUModelRunner.prepare_attn``: the batch's block-table rows and its slot mappings."""
    tables = runner_state.block_tables
    tables.gather_block_tables(batch.idx_mapping, num_reqs_padded=batch.num_reqs_after_padding,
                               num_computed_tokens=runner_state.req_states.num_computed_tokens.gpu)
    tables.compute_slot_mappings(batch.idx_mapping, batch.query_start_loc, batch.positions,
                                 num_tokens_padded=batch.num_tokens_after_padding)
