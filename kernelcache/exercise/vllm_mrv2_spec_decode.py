"""Drive Model Runner V2's speculative decoding (EAGLE / EAGLE-3) as a server with drafts runs it.

With a ``speculative_config`` Model Runner V2 builds a request state with draft slots, a ``Sampler`` for
``k + 1`` logits per request, a ``RejectionSampler`` and an ``EagleSpeculator`` (``init_speculator``); its
warmup (``warmup_kernels``) runs real drafted steps, so every kernel compiles at engine start unless the cache
holds it. ``mrv2_spec_decode`` builds those objects with the runner's constructor arguments and replays
``execute_model`` + ``sample_tokens``: the target side (``prepare_inputs`` with drafts, the grammar bitmask,
the ``RejectionSampler`` or the ``Sampler``, ``post_update``) and ``EagleSpeculator.propose`` with the draft
model's forward and attention metadata stubbed.

``entries``: ``warmup`` (the warmup's step sequence) and ``batches`` (one batch per integer class). In cross mode
the CUDA runtime calls on the way are faked by exercise/fake_runner_ops.py (listed in the summary, with this
module's own stubs). What is not covered (ngram, MTP and other speculators, FLy / synthetic rejection, …):
docs/FAMILIES.md, "mrv2_spec_decode".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..plan.families.mrv2_spec_decode import CONTACTS
from ..plan.releases import resolve, since
from . import fake_ops
from .drivers import SPLIT_MAX_BATCH, cross, device_scope, model_logits, require_triton, sm_count
from .fake_runner_ops import runner_ops
from .vllm_runner import MIXES, Config, host_tensor, logprob_classes, prepare_attn, sampling_params
from .watch import seen

ENTRIES = ("warmup", "batches")
METHODS = ("eagle3", "eagle")
MAX_LOGPROBS = 20  # vllm/config/model.py ModelConfig.max_logprobs default
DRAFT_HIDDEN = 4096  # only its % 16 class reaches a key (update_draft_inputs' hidden_size and strides)
AUX_LAYERS = 3  # EAGLE-3 feeds the drafter three target layers' hidden states (eagle3_utils.py)
STUBS = ["draft model forward (fresh [tokens, hidden] model-dtype tensors)",
         "draft compute_logits (LM-head-shaped logits)", "EAGLE-3 combine_hidden_states (fresh tensor)",
         "draft attention metadata (None: no attention backend)"]


def mrv2_spec_decode(*, vocab: int, max_num_seqs: int, num_speculative_tokens: int, max_model_len: int,
                     max_num_batched_tokens: int, block_size: int = 16, dtypes: list[str] | None = None,
                     method: str = "eagle3", entries: list[str] | None = None) -> dict:
    """Every entry for one config; returns what ran (calls per case, the layouts, the substitutions)."""
    entries = list(entries) if entries else list(ENTRIES)
    check_arguments(num_speculative_tokens, method, entries)
    require_triton()
    dtypes = dtypes or ["bfloat16"]
    spec = Spec(Config(vocab, max_num_seqs, max_model_len, max_num_batched_tokens, block_size),
                num_speculative_tokens, method, model_dtype(dtypes))
    calls: Counter = Counter()
    # The speculator imports attn_utils (-> fa_utils, which imports vllm_flash_attn) and vllm.v1.worker.utils
    # (-> w8a8_utils, which asks _C.cutlass_scaled_mm_supports_block_fp8 at import): exercise/fake_ops.py.
    shims = install_fakes()
    with device_scope(), runner_ops(cross()) as substituted, host_ops(cross()):
        if "warmup" in entries:
            warmup(spec, calls)
        layouts = batch_layouts(spec) if "batches" in entries else []
        for layout in layouts:
            run_layout(spec, layout, dtypes, calls)
        if "batches" in entries:
            for k in logprob_classes(MAX_LOGPROBS, vocab):
                for dtype in dtypes:
                    run_round(spec, Layout(1, 0, 0), "greedy", dtype, num_logprobs=k)
                    calls[f"{dtype}:logprobs"] += 1
    return {"method": method, "num_speculative_tokens": num_speculative_tokens, "entries": entries,
            "layouts": [list(layout) for layout in layouts], "calls": dict(calls),
            "c_ops_faked": substituted, "import_fakes": shims, "stubbed": STUBS}


IMPORT_OPS = ("cutlass_scaled_mm_supports_block_fp8",)  # _C ops vLLM calls at import on this path


def install_fakes() -> dict:
    """fake_ops' import shims and, of its ops, only the import-time queries this path meets (registering the
    MoE ops would collide with a ``_moe_C`` extension loaded later): what this process substituted."""
    imports = fake_ops.install_import_shims()
    ops = []
    for spec in (s for s in fake_ops.OPS if s.name in IMPORT_OPS):
        if spec.qualname not in fake_ops._SUBSTITUTED and not fake_ops._present(spec):
            fake_ops._register(spec)
            fake_ops._SUBSTITUTED[spec.qualname] = {"op": spec.qualname, "upstream": spec.upstream,
                                                    "torch": spec.torch_impl.__qualname__}
        if spec.qualname in fake_ops._SUBSTITUTED:
            ops.append(fake_ops._SUBSTITUTED[spec.qualname])
    return {"imports": imports, "ops": ops}


def check_arguments(num_speculative_tokens: int, method: str, entries: list[str]) -> None:
    if num_speculative_tokens < 1:
        raise ValueError("mrv2_spec_decode needs num_speculative_tokens >= 1")
    if method not in METHODS:
        raise ValueError(f"mrv2_spec_decode: method must be among {METHODS}, got {method!r}")
    if set(entries) - set(ENTRIES):
        raise ValueError(f"mrv2_spec_decode: entries must be among {ENTRIES}, got {entries}")


def model_dtype(dtypes: list[str]) -> str:
    """The model's dtype: the first non-fp32 logits dtype (fp32 logits are the processed sampler's)."""
    return next((d for d in dtypes if d != "float32"), dtypes[0])


@dataclass(frozen=True)
class Spec:
    config: Config
    k: int
    method: str
    dtype: str

    @property
    def prompt_len(self) -> int:
        """warmup.py: ``decode_query_len + 1`` prompt tokens, so a prefill is never a uniform decode."""
        return self.k + 2


@dataclass(frozen=True)
class Layout:
    """One verification batch: ``drafted`` requests with k drafts, ``plain`` decodes without drafts,
    ``prefill`` new requests prefilling ``Spec.prompt_len`` tokens."""

    drafted: int
    plain: int
    prefill: int

    def __iter__(self):
        return iter((self.drafted, self.plain, self.prefill))


def host_ops(cross_mode: bool) -> Any:
    """Cross mode: torch calls whose tensors are all real CPU tensors run eagerly on them, as on the GPU
    machine (``TargetDependentARSpeculator.propose`` reads ``seq_lens_cpu_upper_bound[:n].max().item()``);
    under ``FakeTensorMode`` they would turn fake and lose their values."""
    import contextlib

    if not cross_mode:
        return contextlib.nullcontext()
    from torch.overrides import TorchFunctionMode

    class HostOps(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if _all_real_host(args, kwargs):
                import torch

                with torch.utils._python_dispatch._disable_current_modes():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)

    return HostOps()


def _all_real_host(args: tuple, kwargs: dict) -> bool:
    """At least one tensor among the arguments, every one a real (not fake) CPU tensor, and no CUDA device
    named (``async_tensor_h2d``'s ``.to("cuda")`` stays a host-to-device copy)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    values = (*args, *kwargs.values())
    tensors = [a for a in values if isinstance(a, torch.Tensor)]
    to_device = any(isinstance(a, (str, torch.device)) and str(a).startswith("cuda") for a in values)
    return (bool(tensors) and not to_device
            and all(not isinstance(t, FakeTensor) and t.device.type == "cpu" for t in tensors))


# -- the runner's objects ------------------------------------------------------------------------------


@dataclass
class State:
    """``GPUModelRunner``'s objects for a speculative config (model_runner.py ``__init__``, ``load_model``,
    ``initialize_kv_cache``, ``set_attn``): one full-attention KV group, last PP rank."""

    spec: Spec
    req_states: Any
    input_buffers: Any
    block_tables: Any
    sampler: Any
    rejection_sampler: Any
    prompt_logprobs: Any
    structured_outputs: Any
    speculator: Any


def build_state(spec: Spec) -> State:
    import torch
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.input_batch import InputBuffers
    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler
    from vllm.v1.worker.gpu.states import RequestState
    from vllm.v1.worker.gpu.structured_outputs import StructuredOutputsWorker

    config, device = spec.config, torch.device("cuda")
    seqs, query_len = config.max_num_seqs, spec.k + 1  # decode_query_len (model_runner.py load_model)
    req_states = RequestState(max_num_reqs=seqs, max_model_len=config.max_model_len,
                              max_num_batched_tokens=config.max_num_batched_tokens, num_speculative_steps=spec.k,
                              vocab_size=config.vocab, device=device, num_prefill_lookahead=1)
    block_tables = BlockTables(block_sizes=[config.block_size], max_num_reqs=seqs,
                               max_num_batched_tokens=config.max_num_batched_tokens,
                               max_num_blocks_per_group=[config.max_num_blocks], device=device,
                               slot_mapping_enabled=[True], dcp_sharded=[True], sliding_window_reach=[0])
    sampler = Sampler(vllm_config=_runner_config(spec), max_num_reqs=seqs, vocab_size=config.vocab, device=device,
                      req_states=req_states, logprobs_mode="raw_logprobs", num_speculative_tokens=query_len)
    return State(spec, req_states, InputBuffers(seqs, config.max_num_batched_tokens, device), block_tables, sampler,
                 RejectionSampler(sampler, _runner_config(spec).speculative_config, device, watermark_key=None),
                 PromptLogprobsWorker(seqs, device, logprobs_mode="raw_logprobs"),
                 StructuredOutputsWorker(max_num_logits=seqs * query_len, vocab_size=config.vocab, device=device,
                                         mask_stride=query_len),
                 build_speculator(spec, block_tables))


def _spec_default(name: str) -> Any:
    """A ``SpeculativeConfig`` field's default (vllm/config/speculative.py), as a server without overrides has."""
    import dataclasses

    from vllm.config.speculative import SpeculativeConfig

    field = {f.name: f for f in dataclasses.fields(SpeculativeConfig)}[name]
    return getattr(field.default, "default", field.default)


def _runner_config(spec: Spec) -> Any:
    """What the sampler, the rejection sampler and the speculator read of the ``VllmConfig``."""
    from types import SimpleNamespace

    import torch

    config, dtype = spec.config, getattr(torch, spec.dtype)
    draft_model = SimpleNamespace(get_hidden_size=lambda: DRAFT_HIDDEN, get_vocab_size=lambda: config.vocab,
                                  hf_config=SimpleNamespace())
    names = ("draft_sample_method", "rejection_sample_method", "fly_entropy_threshold", "fly_entropy_top_k",
             "fly_window_size", "synthetic_acceptance_rates", "enable_adaptive_verification",
             "use_local_argmax_reduction")
    # From 0.34 the speculator also reads the draft's context-parallel size and its config overrides (None: the
    # target's; SpeculativeConfig's defaults).
    speculative = SimpleNamespace(method=spec.method, num_speculative_tokens=spec.k, draft_model_config=draft_model,
                                  uses_dynamic_speculative_decoding=lambda: False,
                                  draft_decode_context_parallel_size=None, moe_backend=None, attention_backend=None,
                                  kv_cache_dtype=None, **{name: _spec_default(name) for name in names})
    return SimpleNamespace(
        speculative_config=speculative, reasoning_config=None, watermark_config=None,
        scheduler_config=SimpleNamespace(max_num_seqs=config.max_num_seqs,
                                         max_num_batched_tokens=config.max_num_batched_tokens),
        model_config=SimpleNamespace(max_model_len=config.max_model_len, dtype=dtype, head_dtype=dtype,
                                     use_fp64_gumbel=False),
        parallel_config=SimpleNamespace(data_parallel_size=1, data_parallel_rank=0, decode_context_parallel_size=1,
                                        prefill_context_parallel_size=1, use_ubatching=False,
                                        enable_batch_sharded_sampling=False))


class DraftModel:
    """The drafter's weights-dependent parts (``STUBS``): fresh tensors of the shapes and dtype they return."""

    def __init__(self, spec: Spec):
        import torch

        self.spec, self.dtype = spec, getattr(torch, spec.dtype)

    def hidden(self, rows: int) -> Any:
        import torch

        return torch.randn((rows, DRAFT_HIDDEN), dtype=self.dtype, device="cuda")

    def combine_hidden_states(self, hidden_states: Any) -> Any:
        return self.hidden(hidden_states.shape[0])

    def compute_logits(self, hidden_states: Any) -> Any:
        return model_logits(hidden_states.shape[0], self.spec.config.vocab, self.dtype)

    def forward(self, num_tokens: int, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """``_run_model``: LlamaEagle3's forward returns (hidden_states, aux_output), two tensors."""
        return self.hidden(num_tokens), self.hidden(num_tokens)


def build_speculator(spec: Spec, block_tables: Any) -> Any:
    """``init_speculator`` -> ``EagleSpeculator``, then ``load_model`` / ``set_attn``'s attributes.

    ``_target_feeds_hc_residual`` resolves the target model class; a Llama target (the recipes') has no
    ``get_mtp_target_hidden_states``, so it is False without loading the class."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu.spec_decode import speculator as base
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator import TargetDependentARSpeculator

    class EagleSpeculator(TargetDependentARSpeculator):
        """vLLM's own ``EagleSpeculator`` (spec_decode/eagle/speculator.py) adds only ``load_draft_model`` (the
        weights, stubbed here); importing it would pull the online-quantized LM head and its C-op queries."""

        def load_draft_model(self, target_model: Any, target_attn_layer_names: set[str]) -> Any:
            return DraftModel(spec)

    saved = base._target_feeds_hc_residual
    base._target_feeds_hc_residual = lambda vllm_config: False
    try:
        import torch

        speculator = EagleSpeculator(_runner_config(spec), torch.device("cuda"))
    finally:
        base._target_feeds_hc_residual = saved
    draft = DraftModel(spec)
    speculator.model = draft
    speculator._run_model = draft.forward
    speculator._build_uniform_attn_metadata = lambda **kwargs: None
    speculator.block_tables = block_tables  # set_attn: the target runner's BlockTables
    speculator.kv_cache_config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=["draft.attn"])])
    speculator.draft_attn_layer_names = {"draft.attn"}
    return speculator


# -- the step sequence ---------------------------------------------------------------------------------


def warmup(spec: Spec, calls: Counter) -> None:
    """warmup.py ``_warmup_kernels``, once with ``for_sampler_warmup()`` and once greedy: every request
    prefills ``k + 2`` tokens (grammar bitmask on), then decode steps (all drafted), ([0, 1]: drafted,
    plain), ([0, 1]: plain, plain), ([0]: drafted), ([0]: plain)."""
    config = spec.config
    num_reqs = min(config.max_num_seqs, config.max_num_batched_tokens // max(spec.prompt_len, spec.k + 1))
    steps = [[True] * num_reqs]
    if num_reqs >= 2:
        steps += [[True, False], [False, False]]
    steps += [[True], [False]]
    for mode in ("top_k_top_p", "greedy"):
        state = build_state(spec)
        indices = add_requests(state, num_reqs, mode, num_logprobs=5)
        step(state, spec.dtype, indices, [spec.prompt_len] * num_reqs, [0] * num_reqs, grammar=True)
        for flags in steps:
            chosen = indices[:len(flags)]
            step(state, spec.dtype, chosen, [spec.k + 1 if f else 1 for f in flags],
                 [spec.k if f else 0 for f in flags])
        calls[f"warmup:{mode}"] += 1


def run_layout(spec: Spec, layout: Layout, dtypes: list[str], calls: Counter) -> None:
    """A layout greedy in each logits dtype (raw logits reach the rejection kernels) and with every sampler
    feature (processed fp32 logits); the other sampling mixes where the verified rows are a top-k/top-p
    batch class of their own."""
    for dtype in dtypes:
        run_round(spec, layout, "greedy", dtype, num_logprobs=5)
        calls[f"{dtype}:greedy"] += 1
    run_round(spec, layout, "top_k_top_p", spec.dtype, num_logprobs=5)
    calls[f"{spec.dtype}:top_k_top_p"] += 1
    if layout.drafted and _is_topk_representative(spec, layout):
        for mode in MIXES:
            if mode not in ("greedy", "top_k_top_p"):
                run_round(spec, layout, mode, spec.dtype, num_logprobs=5)
                calls[f"{spec.dtype}:{mode}"] += 1


def run_round(spec: Spec, layout: Layout, mode: str, dtype: str, num_logprobs: int) -> None:
    """Prefill the decoding requests (no drafts: the ``Sampler``; the speculator drafts), then one step
    verifying ``layout`` (new prefills join with a grammar bitmask)."""
    drafted, plain, prefill = layout
    state = build_state(spec)
    decoding = add_requests(state, drafted + plain, mode, num_logprobs)
    if decoding:
        step(state, dtype, decoding, [spec.prompt_len] * len(decoding), [0] * len(decoding), grammar=False)
    joining = add_requests(state, prefill, mode, num_logprobs, first=drafted + plain)
    scheduled = [spec.k + 1] * drafted + [1] * plain + [spec.prompt_len] * prefill
    step(state, dtype, decoding + joining, scheduled, [spec.k] * drafted + [0] * (plain + prefill),
         grammar=prefill > 0)


def add_requests(state: State, count: int, mode: str, num_logprobs: int, first: int = 0) -> list[int]:
    """``GPUModelRunner.add_requests``: ``count`` new requests with ``k + 2``-token prompts, then
    ``execute_model``'s staged writes (request state, sampler, block tables)."""
    from vllm.utils.math_utils import cdiv

    spec = state.spec
    prompt_len = spec.prompt_len
    # The scheduler's reservation (warmup.py _reserved_block_count): the prompt, a few decode steps, lookahead.
    blocks = cdiv(prompt_len + 7 * (spec.k + 1), spec.config.block_size)
    indices = []
    for i in range(first, first + count):
        req_id, params = f"req-{i}", sampling_params(mode, i, num_logprobs)
        state.req_states.add_request(req_id=req_id, prompt_len=prompt_len, all_token_ids=list(range(prompt_len)),
                                     num_computed_tokens=0, max_tokens=params.max_tokens)
        index = state.req_states.req_id_to_index[req_id]
        state.block_tables.append_block_ids(index, (list(range(1 + index * blocks, 1 + (index + 1) * blocks)),),
                                            overwrite=True)
        state.sampler.add_request(index, params)
        state.prompt_logprobs.add_request(req_id, index, params)
        indices.append(index)
    state.req_states.apply_staged_writes()
    state.sampler.apply_staged_writes()
    state.block_tables.apply_staged_writes()
    return indices


def step(state: State, dtype: str, indices: list[int], scheduled: list[int], drafts: list[int],
         grammar: bool = False) -> None:
    """One ``execute_model`` + ``sample_tokens`` (model_runner.py): inputs, attention, sampling or
    verification, prompt logprobs, ``post_update``, the speculator's proposal."""
    import numpy as np
    import torch

    seen("mrv2_spec_decode.step", drafts=drafts)
    spec = state.spec
    batch = prepare_inputs(state, np.array(indices, dtype=np.intp), np.array(scheduled, dtype=np.int32),
                           np.array(drafts, dtype=np.int32) if any(drafts) else None)
    prepare_attn(state, batch)
    hidden = torch.randn((batch.num_tokens, DRAFT_HIDDEN), dtype=getattr(torch, spec.dtype), device="cuda")
    output = sample(state, batch, dtype, grammar)
    if batch.has_prefill:
        state.prompt_logprobs.compute_prompt_logprobs(
            lambda h: model_logits(h.shape[0], spec.config.vocab, getattr(torch, dtype)), hidden, batch,
            state.req_states.all_token_ids.gpu, state.req_states.num_computed_tokens.gpu,
            state.req_states.prompt_len.np)
    post_update(state, batch, output)
    seen("mrv2_spec_decode.sampled", output=output)
    propose(state, batch, hidden, output)
    seen("mrv2_spec_decode.proposed", state=state, batch=batch)
    state.req_states.num_computed_tokens_np[batch.idx_mapping_np] += batch.num_scheduled_tokens
    seen("mrv2_spec_decode.stepped", drafts=drafts)


def sample(state: State, batch: Any, dtype: str, grammar: bool) -> Any:
    """``GPUModelRunner.sample``: the grammar bitmask, then the rejection sampler for a batch with drafts, the
    sampler otherwise. vLLM 0.33 also masked the drafts the bitmask left unchecked (``grammar_invalid_drafts``,
    an argument of the rejection sampler); 0.34 has neither (plan/families/mrv2_spec_decode.py)."""
    import numpy as np
    import torch

    vocab = state.spec.config.vocab
    logits = model_logits(int(batch.cu_num_logits_np[-1]), vocab, getattr(torch, dtype))
    invalid = None
    if grammar:  # warmup.py: every request structured, a permissive bitmask with decode_query_len rows each
        bitmask = np.full((batch.num_reqs * (state.spec.k + 1), (vocab + 31) // 32), -1, dtype=np.int32)
        state.structured_outputs.apply_grammar_bitmask(logits, batch, batch.req_ids, bitmask)
        if not since("0.34"):
            invalid = resolve(CONTACTS, "grammar_invalid_drafts")(batch, batch.req_ids, None)
    if batch.num_draft_tokens == 0:
        return state.sampler(logits, batch)
    if since("0.34"):
        return state.rejection_sampler(logits, batch, state.speculator.draft_logits)
    return state.rejection_sampler(logits, batch, state.speculator.draft_logits, invalid)


def post_update(state: State, batch: Any, output: Any) -> None:
    """``GPUModelRunner.postprocess_sampled``."""
    from vllm.v1.worker.gpu.input_batch import post_update as mrv2_post_update

    req = state.req_states
    mrv2_post_update(batch.idx_mapping, req.num_computed_tokens.gpu, req.last_sampled_tokens,
                     state.sampler.penalties_state.output_bin_counts, output.sampled_token_ids, output.num_sampled,
                     output.num_rejected, batch.query_start_loc, req.all_token_ids.gpu, req.total_len.gpu, None,
                     req.draft_tokens)


def propose(state: State, batch: Any, hidden: Any, output: Any) -> None:
    """``sample_tokens``' speculator call and the draft write-back into the request state."""
    spec, req = state.spec, state.req_states
    aux = [hidden.new_empty(hidden.shape) for _ in range(AUX_LAYERS)] if spec.method == "eagle3" else None
    drafts = state.speculator.propose(
        batch, None, None, hidden, aux, output.num_sampled, output.num_rejected, req.last_sampled_tokens,
        req.next_prefill_tokens, state.sampler.sampling_states.temperature.gpu,
        state.sampler.sampling_states.seeds.gpu, is_profile=True, num_speculative_tokens=spec.k)
    req.draft_tokens[batch.idx_mapping] = drafts


def prepare_inputs(state: State, idx_mapping_np: Any, scheduled: Any, drafts: Any) -> Any:
    """``GPUModelRunner.prepare_inputs`` (model_runner.py) without padding or adaptive verification."""
    import numpy as np
    import torch
    from vllm.utils.torch_utils import async_tensor_h2d
    from vllm.v1.worker.gpu.input_batch import (
        combine_sampled_and_draft_tokens,
        expand_idx_mapping,
        prepare_pos_seq_lens,
        prepare_prefill_inputs,
    )

    req, buffers, device = state.req_states, state.input_buffers, state.input_buffers.device
    num_reqs, num_tokens = len(idx_mapping_np), int(scheduled.sum())
    idx_mapping = async_tensor_h2d(idx_mapping_np, device=device, dtype=torch.int64)
    if drafts is None:  # no draft token scheduled: one logit per request
        total_drafts, num_logits = 0, num_reqs
        cu_num_logits_np = np.arange(num_reqs + 1, dtype=np.int32)
        cu_num_logits = torch.arange(num_reqs + 1, device=device, dtype=torch.int32)
        expanded, local_pos = idx_mapping, torch.zeros(num_reqs, dtype=torch.int32, device=device)
    else:
        total_drafts = int(drafts.sum())
        num_logits = num_reqs + total_drafts
        cu_num_logits_np = np.empty(num_reqs + 1, dtype=np.int32)
        cu_num_logits_np[0] = 0
        np.cumsum(drafts + 1, out=cu_num_logits_np[1:])
        cu_num_logits = async_tensor_h2d(cu_num_logits_np, device=device)
    query_start_loc_np = np.empty(state.spec.config.max_num_seqs + 1, dtype=np.int32)
    query_start_loc_np[0] = 0
    np.cumsum(scheduled, out=query_start_loc_np[1:num_reqs + 1])
    query_start_loc_np[num_reqs + 1:] = num_tokens
    async_tensor_h2d(query_start_loc_np, out=buffers.query_start_loc)
    query_start_loc = buffers.query_start_loc[:num_reqs + 1]
    if drafts is not None:
        expanded, local_pos = expand_idx_mapping(idx_mapping, num_logits, cu_num_logits, state.spec.k + 1)
    computed = req.num_computed_tokens_np[idx_mapping_np]
    prefill_len = req.prefill_len.np[idx_mapping_np]
    prefilling = computed < prefill_len
    if prefilling.any():
        prepare_prefill_inputs(buffers.input_ids, req.next_prefill_tokens, idx_mapping, query_start_loc,
                               req.all_token_ids.gpu, req.prefill_len.gpu, req.num_computed_tokens.gpu)
    prepare_pos_seq_lens(idx_mapping, query_start_loc, req.num_computed_tokens.gpu, buffers.positions,
                         buffers.seq_lens)
    seq_lens = buffers.seq_lens[:num_reqs]
    logits_indices = combine_sampled_and_draft_tokens(buffers.input_ids, idx_mapping, req.last_sampled_tokens,
                                                      query_start_loc, seq_lens, req.prefill_len.gpu,
                                                      req.draft_tokens, cu_num_logits, num_logits, 1)
    return _input_batch(state, locals())


def _input_batch(state: State, v: dict) -> Any:
    """The ``InputBatch`` ``prepare_inputs`` returns, from its locals."""
    from vllm.v1.worker.gpu.input_batch import InputBatch

    req, buffers, num_reqs, num_tokens = state.req_states, state.input_buffers, v["num_reqs"], v["num_tokens"]
    computed, scheduled, prefilling = v["computed"], v["scheduled"], v["prefilling"]
    return InputBatch(
        req_ids=[req.index_to_req_id[int(i)] for i in v["idx_mapping_np"]], num_reqs=num_reqs,
        num_reqs_after_padding=num_reqs, idx_mapping=v["idx_mapping"], idx_mapping_np=v["idx_mapping_np"],
        expanded_idx_mapping=v["expanded"], expanded_local_pos=v["local_pos"], num_scheduled_tokens=scheduled,
        num_tokens=num_tokens, num_tokens_after_padding=num_tokens, num_draft_tokens=v["total_drafts"],
        num_draft_tokens_per_req=v["drafts"], query_start_loc=v["query_start_loc"],
        query_start_loc_np=v["query_start_loc_np"][:num_reqs + 1], seq_lens=v["seq_lens"],
        seq_lens_cpu_upper_bound=host_tensor((computed + scheduled).astype("int32")), dcp_local_seq_lens=None,
        num_computed_tokens_np=computed, prefill_len_np=v["prefill_len"],
        num_computed_prefill_tokens_np=computed.copy(),
        is_prefilling_np=prefilling, has_prefill=bool(prefilling.any()), decode_graph_eligible=not prefilling.any(),
        input_ids=buffers.input_ids[:num_tokens], positions=buffers.positions[:num_tokens],
        is_padding=buffers.is_padding[:num_tokens], logits_indices=v["logits_indices"],
        cu_num_logits=v["cu_num_logits"], cu_num_logits_np=v["cu_num_logits_np"],
        has_structured_output_reqs=False, prompt_lens=None)


# -- which batches -------------------------------------------------------------------------------------


def batch_layouts(spec: Spec) -> list[Layout]:
    """One layout per distinct class of the integers the drafted path hands Triton, over every batch of
    1..max_num_seqs requests: all drafted, drafted + one plain decode, drafted + one new prefill, plain
    decodes only. Classes: ``== 1`` / ``% 16 == 0`` of the request, logit-row, token and draft counts (and of
    the prefill step before), and the top-k/top-p batch class of the verified and of the prefill rows."""
    config = spec.config
    seen, picks = set(), []
    for plain, prefill in ((0, 0), (1, 0), (0, 1)):
        for drafted in range(1, config.max_num_seqs - plain - prefill + 1):
            _pick(spec, Layout(drafted, plain, prefill), seen, picks)
    for plain in range(1, config.max_num_seqs + 1):
        _pick(spec, Layout(0, plain, 0), seen, picks)
    return picks


def _pick(spec: Spec, layout: Layout, seen: set, picks: list) -> None:
    drafted, plain, prefill = layout
    reqs, decoding = drafted + plain + prefill, drafted + plain
    rows = drafted * (spec.k + 1) + plain + prefill
    tokens = rows + prefill * (spec.prompt_len - 1)
    if max(tokens, decoding * spec.prompt_len) > spec.config.max_num_batched_tokens:
        return
    cls = (plain > 0, prefill > 0, drafted > 0, *(_int_class(x) for x in (reqs, rows, tokens, drafted * spec.k,
                                                                         decoding, decoding * spec.prompt_len)),
           _topk_class(spec, rows), _topk_class(spec, decoding))
    if cls not in seen:
        seen.add(cls)
        picks.append(layout)


def _int_class(x: int) -> tuple[bool, bool]:
    """What Triton specializes an integer argument on (``== 1``, ``% 16 == 0``)."""
    return x == 1, x % 16 == 0


def _topk_class(spec: Spec, rows: int) -> tuple:
    """The top-k/top-p batch class of ``rows`` (drivers.batch_classes)."""
    from vllm.v1.sample.ops.topk_topp_triton import _topp_split_count

    split = _topp_split_count(rows, spec.config.vocab, sm_count()) if rows <= SPLIT_MAX_BATCH else None
    return rows == 1, rows <= SPLIT_MAX_BATCH, split


def _is_topk_representative(spec: Spec, layout: Layout) -> bool:
    """The first all-drafted layout of each top-k/top-p class of its verified rows."""
    drafted = layout.drafted
    if layout.plain or layout.prefill:
        return False
    rows = drafted * (spec.k + 1)
    first = next(d for d in range(1, drafted + 1) if _topk_class(spec, d * (spec.k + 1)) == _topk_class(spec, rows))
    return first == drafted
