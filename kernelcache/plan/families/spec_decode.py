"""The V1 runner's speculative decoding (exercise/vllm_spec_decode.py): the registry's rejection-sampler and
EAGLE kernels and ``RejectionSampler.forward`` over drafted batches."""

from __future__ import annotations

from ..family import About, Family, Task
from ..releases import Contact
from .sampler import V1_RUNNER_GONE, processed

# The V1 runner's rejection sampler and EAGLE proposer kernels (exercise/vllm_spec_decode.py): 0.33 only.
CONTACTS = tuple(Contact(symbol.rpartition(":")[2], symbol, ("0.33",)) for symbol in (
    "vllm.model_executor.warmup.jit_warmup:JitWarmupRegistry", "vllm.v1.sample.rejection_sampler:GREEDY_TEMPERATURE",
    "vllm.v1.sample.rejection_sampler:RejectionSampler", "vllm.v1.sample.sampler:Sampler",
    "vllm.v1.spec_decode.metadata:SpecDecodeMetadata", "vllm.v1.spec_decode:utils"))


class SpecDecode(Family):
    name = "mrv1_spec_decode"
    exercise = "kernelcache.exercise.vllm_spec_decode:spec_decode"
    about = About(
        "the V1 runner's rejection sampler and EAGLE kernels over drafted batches",
        ("vllm.v1.spec_decode.utils", "vLLM's speculative-decoding kernels"),
        reads=("vocab", "max_num_seqs", "num_speculative_tokens", "max_model_len", "dtypes", "fp64_gumbel"),
        note="need drafts", probe="tests/probes/spec_decode_keys.py", gpu_check="spec_decode", proven="H200",
        releases=("0.33",), lacks=V1_RUNNER_GONE, contacts=CONTACTS)
    needs_drafts = True

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        if plan.num_speculative_tokens < 1 or not processed(plan):
            return ()
        return (self.task({
            "vocab": vocab, "max_num_seqs": plan.max_num_seqs, "num_speculative_tokens": plan.num_speculative_tokens,
            "max_model_len": plan.max_model_len, "dtypes": list(plan.dtypes), "fp64_gumbel": plan.fp64_gumbel}),)


FAMILY = SpecDecode()
