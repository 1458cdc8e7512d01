"""Drive vLLM's speculative-decoding Triton kernels so a build holds every key a server with drafts asks for.

One exercise task (see exercise/worker.py), ``mrv1_spec_decode``, in two parts:

* **registry**: vLLM's own ``JitWarmupRegistry`` over the registrations its spec-decode objects make at
  engine start: ``RejectionSampler.__init__`` (greedy and random rejection, ``_expand``, recovered-token
  sampling; vllm/v1/sample/rejection_sampler.py) and ``LLMBaseProposer.__init__`` (EAGLE's slot mapping,
  input preparation and next-token kernels; vllm/v1/spec_decode/llm_base_proposer.py), with the recipe's
  ``max_num_seqs``, ``max_model_len``, vocab and ``num_speculative_tokens``;
* **rejection**: ``RejectionSampler.forward`` itself, on ``SpecDecodeMetadata.make_dummy`` drafts (what
  vLLM's own dummy sampler run uses; ``draft_layouts``): all-greedy, mixed and all-random batches, the
  random ones in each top-k/top-p mode, with draft probabilities (a draft model) and without (EAGLE,
  n-gram). This reaches what the registry does not: the rejection kernels with the int32 bonus tokens the
  bonus ``Sampler`` returns (vLLM's warmup registers int64 ones: 2 greedy and 2 random keys a server would
  compile on its first drafted request), the top-k/top-p kernels on the dense fp32 draft rows, ``_expand``.

FLy and synthetic rejection modes are left out (recipe opt-ins vLLM turns on with ``rejection_sample_method``).
Cross mode runs behind the fake target as the sampler paths do (exercise/vllm_sampler.py).
"""

from __future__ import annotations

from collections import Counter

from .drivers import device_scope, model_logits, require_triton
from .vllm_sampler import MODES, kernel_name, mrv1_metadata, registry_config, replace_metadata, seeded_generator


def spec_decode(vocab: int, max_num_seqs: int, num_speculative_tokens: int, max_model_len: int,
                dtypes: list[str] | None = None, fp64_gumbel: bool = False) -> dict:
    """Both parts for one vocab size; returns what each part ran."""
    if num_speculative_tokens < 1:
        raise ValueError("spec_decode needs num_speculative_tokens >= 1")
    require_triton()
    with device_scope():
        keys = registry(vocab, max_num_seqs, num_speculative_tokens, max_model_len, fp64_gumbel)
        calls = rejection(vocab, max_num_seqs, num_speculative_tokens, dtypes or ["float32"])
    return {"registry": keys, "rejection": calls}


def _rejection_sampler(fp64_gumbel: bool):
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    sampler = Sampler()
    sampler.use_fp64_gumbel = fp64_gumbel  # RejectionSampler reads it from its sampler
    return RejectionSampler(sampler)


def registry(vocab: int, max_num_seqs: int, num_speculative_tokens: int, max_model_len: int,
             fp64_gumbel: bool = False) -> dict:
    """What vLLM's registry compiles for these objects and this config, per kernel: the number of keys."""
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry
    from vllm.v1.spec_decode import utils

    config = registry_config(vocab, max_num_seqs, num_speculative_tokens)
    reg = JitWarmupRegistry(config)
    with reg.activate():
        _rejection_sampler(fp64_gumbel)
        # LLMBaseProposer.__init__'s registrations, with its arguments (its constructor needs a draft model).
        utils._eagle_step_slot_mapping_metadata.register_warmup(max_model_len=max_model_len,
                                                                max_batch_size=max_num_seqs)
        utils._eagle_prepare_inputs_padded.register_warmup(max_batch_size=max_num_seqs)
        utils._eagle_prepare_next_token_padded.register_warmup(
            vocab_size=vocab, num_sampled_tokens_per_req=num_speculative_tokens + 1, max_batch_size=max_num_seqs)
    keys = {kernel_name(kernel): len(_keys(kernel, calls, config)) for kernel, calls in reg._registrations.items()}
    reg.warmup()
    return keys


def _keys(kernel, calls, config) -> set:
    """The compile keys of one kernel's registrations, expanded as ``JitWarmupRegistry.warmup`` does."""
    import inspect

    found = set()
    for args, kwargs in calls:
        if not args and not kwargs and "vllm_config" in inspect.signature(kernel.get_warmup_keys).parameters:
            kwargs = {"vllm_config": config}
        found.update(kernel.get_warmup_keys(*args, **kwargs))
    return found


def rejection(vocab: int, max_num_seqs: int, num_speculative_tokens: int, dtypes: list[str]) -> dict:
    """``RejectionSampler.forward`` over the draft layouts a server sees, each composition and sampling mode."""
    import torch
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    sampler = _rejection_sampler(False)
    calls = Counter()
    for drafts in draft_layouts(vocab, max_num_seqs, num_speculative_tokens):
        metadata = SpecDecodeMetadata.make_dummy([[0] * n for n in drafts], torch.device("cuda"))
        num_tokens, batch = sum(drafts), len(drafts)
        for composition, mode, with_probs, dtype in _cases(dtypes):
            logits = model_logits(num_tokens + batch, vocab, getattr(torch, dtype))
            draft_probs = torch.rand((num_tokens, vocab), dtype=torch.float32, device="cuda") if with_probs else None
            sampler(metadata, draft_probs, logits, _sampling(batch, vocab, composition, mode))
            calls[f"{composition}:{mode}:{dtype}:{'probs' if with_probs else 'noprobs'}"] += 1
    return dict(calls)


def _cases(dtypes: list[str]) -> list[tuple[str, str, bool, str]]:
    """(composition, sampling mode, draft probs given, logits dtype): greedy and mixed batches, random ones in
    each top-k/top-p mode, with and without draft probabilities; other logits dtypes on plain random rows."""
    cases = [(c, "none", p, "float32") for c in ("greedy", "mixed") for p in (True, False)]
    cases += [("random", m, p, "float32") for m in ("none", *MODES) for p in (True, False)]
    cases += [("random", "none", p, d) for d in dtypes if d != "float32" for p in (True, False)]
    return cases


def draft_layouts(vocab: int, max_num_seqs: int, num_speculative_tokens: int) -> list[list[int]]:
    """Draft counts per request: for every batch class of the draft rows (the top-k/top-p kernels see
    ``sum(drafts)`` rows: 1, each split count, more than 64) the fewest requests holding that many drafts,
    and every ``max_spec_len`` from 1 to ``num_speculative_tokens`` (an int Triton specializes on)."""
    from .drivers import batch_classes, sm_count

    layouts = []
    for rows in batch_classes(vocab, max_num_seqs * num_speculative_tokens, sm_count()):
        full, rest = divmod(rows, num_speculative_tokens)
        layouts.append([num_speculative_tokens] * full + ([rest] if rest else []))
    layouts += [[spec] * max_num_seqs for spec in range(1, num_speculative_tokens + 1)]
    layouts += [[spec] for spec in range(1, num_speculative_tokens + 1)]
    unique = {tuple(layout) for layout in layouts}
    return [list(layout) for layout in sorted(unique, key=lambda d: (sum(d), d))]


def _sampling(batch: int, vocab: int, composition: str, mode: str):
    """The target model's sampling metadata: greedy rows have vLLM's greedy temperature
    (GREEDY_TEMPERATURE in rejection_sampler.py), random rows a seeded generator on request 0 and the mode's
    top-k/top-p."""
    import torch
    from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE

    use_k, use_p = MODES.get(mode, (False, False))
    metadata = mrv1_metadata(batch, vocab, use_k=use_k, use_p=use_p)
    temperature = torch.full((batch,), 0.7, device="cuda")
    if composition == "greedy":
        temperature = torch.full((batch,), float(GREEDY_TEMPERATURE), device="cuda")
    elif composition == "mixed":
        temperature[0] = GREEDY_TEMPERATURE
    generators = {0: seeded_generator(seed=0)} if composition != "greedy" else {}
    return replace_metadata(metadata, temperature=temperature, all_greedy=composition == "greedy",
                    all_random=composition == "random", generators=generators)
