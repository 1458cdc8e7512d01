"""What an exercise process runs: ``Task`` records, planned here and run by exercise/worker.py.

A plan's work comes in units, one exercise process each (``plan_units``): one per vocab size (the
sampler, runner and speculative-decoding paths, ``vocab_tasks``) and one for the model's own layers
(``model_tasks``: the fused-MoE, Triton-attention, Mamba-2 and gated-delta-net kernels), which do not depend on
the vocab."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .recipe import BuildPlan

SAMPLER = "kernelcache.exercise.vllm_sampler"
SPEC_DECODE = "kernelcache.exercise.vllm_spec_decode"
MOE = "kernelcache.exercise.vllm_moe"
RUNNER = "kernelcache.exercise.vllm_runner"
ATTENTION = "kernelcache.exercise.vllm_attention"
MAMBA = "kernelcache.exercise.vllm_mamba"
MRV2_SPEC_DECODE = "kernelcache.exercise.vllm_mrv2_spec_decode"
GDN = "kernelcache.exercise.vllm_gdn"
FLASHINFER_ATTENTION = "kernelcache.exercise.vllm_flashinfer"
# The exercise module of each path vLLM configures by device name (format/manifest.py DEVICE_NAME_PATHS).
DEVICE_NAME_MODULES = {"moe": MOE, "mamba": MAMBA}


@dataclass(frozen=True)
class Task:
    """``module:function`` plus keyword arguments; the function returns a JSON-able summary."""

    call: str
    kwargs: dict = field(default_factory=dict)
    label: str = ""


def vocab_tasks(plan: BuildPlan, vocab: int) -> tuple[Task, ...]:
    """The exercise tasks of one vocab size: the requested paths, registry first (the others then hit).

    The runtime paths run one batch size per specialization class of ``1..max_num_seqs*(spec+1)``,
    which the worker derives from vLLM's own split-count rule and the target's SM count. Empty when
    the plan's paths and dtypes select nothing (the processed paths need float32).
    """
    max_batch = plan.max_num_seqs * (plan.num_speculative_tokens + 1)
    processed = "float32" in plan.dtypes
    # Every logits dtype is also a model dtype: an fp32 model's raw logits reach MRV2's Gumbel kernel with
    # APPLY_TEMPERATURE=True, a key of its own (seen missing on the H200 when only bf16/fp16 were raw).
    model_dtypes = list(plan.dtypes)
    tasks = []
    if "registry" in plan.paths and processed:
        tasks.append(Task(f"{SAMPLER}:registry", {"vocab": vocab, "max_num_seqs": plan.max_num_seqs,
                                                   "num_speculative_tokens": plan.num_speculative_tokens},
                          label="registry"))
    if "mrv1" in plan.paths and processed:
        tasks.append(Task(f"{SAMPLER}:mrv1", {"vocab": vocab, "max_batch": max_batch, "modes": list(plan.modes),
                                               "seeded": plan.seeded, "unseeded": plan.unseeded and
                                               "flashinfer" not in plan.paths, "dtypes": list(plan.dtypes)},
                          label="mrv1"))
    if "mrv2" in plan.paths:
        tasks.append(Task(f"{SAMPLER}:mrv2", {
            "vocab": vocab, "max_batch": max_batch, "modes": list(plan.modes) if processed else [],
            "model_dtypes": model_dtypes, "max_num_reqs": plan.max_num_seqs, "min_p": plan.min_p,
            "fp64_gumbel": plan.fp64_gumbel}, label="mrv2"))
    if "mrv1_spec_decode" in plan.paths and plan.num_speculative_tokens > 0 and processed:
        tasks.append(Task(f"{SPEC_DECODE}:spec_decode", {
            "vocab": vocab, "max_num_seqs": plan.max_num_seqs, "num_speculative_tokens": plan.num_speculative_tokens,
            "max_model_len": plan.max_model_len, "dtypes": model_dtypes, "fp64_gumbel": plan.fp64_gumbel},
            label="mrv1_spec_decode"))
    if "mrv2_spec_decode" in plan.paths and plan.num_speculative_tokens > 0:
        tasks.append(Task(f"{MRV2_SPEC_DECODE}:mrv2_spec_decode", {
            "vocab": vocab, "max_num_seqs": plan.max_num_seqs, "num_speculative_tokens": plan.num_speculative_tokens,
            "max_model_len": plan.max_model_len, "max_num_batched_tokens": plan.max_num_batched_tokens,
            "block_size": plan.block_size, "dtypes": model_dtypes}, label="mrv2_spec_decode"))
    if "runner" in plan.paths:
        tasks.append(Task(f"{RUNNER}:runner", {
            "vocab": vocab, "max_num_seqs": plan.max_num_seqs, "max_model_len": plan.max_model_len,
            "max_num_batched_tokens": plan.max_num_batched_tokens, "block_size": plan.block_size,
            "dtypes": model_dtypes}, label="runner"))
    return tuple(tasks)


def model_tasks(plan: BuildPlan) -> tuple[Task, ...]:
    """The model's layers: fused MoE, Mamba-2 and gated delta net once per dtype they run in, Triton attention
    once per sliding window."""
    return moe_tasks(plan) + attention_tasks(plan) + mamba_tasks(plan) + gdn_tasks(plan) + flashinfer_attention_tasks(
        plan)


def gdn_tasks(plan: BuildPlan) -> tuple[Task, ...]:
    """A hybrid model's gated-delta-net layers, once per dtype they run in (empty without the gdn path), with the
    serving settings their kernels depend on: drafts, the prefill backend, and the attention layers' page, which
    the GDN state's page is padded to (its block stride is a constexpr of the decode kernels)."""
    model = plan.model
    if "gdn" not in plan.paths or model is None or model.gdn is None:
        return ()
    return tuple(Task(f"{GDN}:gdn", {
        **asdict(model.gdn), "hidden_size": model.hidden_size, "dtype": dtype, "max_num_seqs": plan.max_num_seqs,
        "max_num_batched_tokens": plan.max_num_batched_tokens, "tensor_parallel_size": plan.tensor_parallel_size,
        "num_speculative_tokens": plan.num_speculative_tokens, "gdn_prefill_backend": plan.gdn_prefill_backend,
        "num_key_value_heads": model.num_key_value_heads, "head_dim": model.head_dim,
        "attention_backend": plan.attention_backend, "kv_cache_dtype": plan.kv_cache_dtype,
        "block_size": plan.block_size, "max_model_len": plan.max_model_len}, label="gdn")
        for dtype in plan.layer_dtypes)


def mamba_tasks(plan: BuildPlan) -> tuple[Task, ...]:
    """A hybrid model's Mamba-2 layers, once per dtype they run in (empty without the mamba path)."""
    model = plan.model
    if "mamba" not in plan.paths or model is None or model.mamba is None:
        return ()
    return tuple(Task(f"{MAMBA}:mamba", {
        **asdict(model.mamba), "hidden_size": model.hidden_size, "dtype": dtype, "max_num_seqs": plan.max_num_seqs,
        "max_num_batched_tokens": plan.max_num_batched_tokens, "tensor_parallel_size": plan.tensor_parallel_size},
        label="mamba") for dtype in plan.layer_dtypes)


def attention_tasks(plan: BuildPlan) -> tuple[Task, ...]:
    """vLLM's Triton attention backend for the model's layers (empty without the attention path)."""
    model = plan.model
    if "attention" not in plan.paths or model is None:
        return ()
    return tuple(Task(f"{ATTENTION}:attention", layer_kwargs(plan, window), label="attention")
                 for window in model.attention_windows)


def layer_kwargs(plan: BuildPlan, window: int) -> dict:
    """What both attention exercises take of the model and the serving flags, for one sliding window."""
    model = plan.model
    return {"num_heads": model.num_attention_heads, "num_kv_heads": model.num_key_value_heads,
            "head_size": model.head_dim, "dtype": model.dtype, "kv_cache_dtype": plan.kv_cache_dtype,
            "block_size": plan.block_size, "max_num_seqs": plan.max_num_seqs, "max_model_len": plan.max_model_len,
            "max_num_batched_tokens": plan.max_num_batched_tokens, "sliding_window": window,
            "tensor_parallel_size": plan.tensor_parallel_size}


def flashinfer_attention_tasks(plan: BuildPlan) -> tuple[Task, ...]:
    """vLLM's FlashInfer attention backend for the model's layers, once per sliding window (each window is a KV-cache
    group with a metadata builder of its own); the task records, and in cross mode builds, the FlashInfer JIT
    modules it asks for (empty without the flashinfer_attention path)."""
    model = plan.model
    if "flashinfer_attention" not in plan.paths or model is None:
        return ()
    return tuple(Task(f"{FLASHINFER_ATTENTION}:flashinfer_attention", {
        **layer_kwargs(plan, window), "logits_soft_cap": model.logits_soft_cap,
        "attention_backend": plan.attention_backend, "cubins": plan.flashinfer_cubins},
        label="flashinfer_attention") for window in model.attention_windows)


def moe_tasks(plan: BuildPlan) -> tuple[Task, ...]:
    """The model's fused-MoE layers, once per dtype they run in (empty without the moe path)."""
    model = plan.model
    if "moe" not in plan.paths or model is None or not model.is_moe:
        return ()
    return tuple(Task(f"{MOE}:moe", {
        "num_experts": model.num_experts, "hidden_size": model.hidden_size,
        "intermediate_size": model.moe_intermediate_size, "top_k": model.num_experts_per_tok, "dtype": dtype,
        "max_num_batched_tokens": plan.max_num_batched_tokens, "tensor_parallel_size": plan.tensor_parallel_size},
        label="moe") for dtype in plan.layer_dtypes)


def plan_units(plan: BuildPlan) -> list[tuple[str, tuple[Task, ...]]]:
    """(name, tasks) per exercise process: each vocab size, then the model's layers; empty units dropped."""
    units = [(str(v.size), vocab_tasks(plan, v.size)) for v in plan.vocabs]
    units.append(("model", model_tasks(plan)))
    return [(name, tasks) for name, tasks in units if tasks]
