"""The sampler families: vLLM's JIT warmup registry, the V1 (MRV1) sampler, Model Runner V2's Gumbel sampler
(exercise/vllm_sampler.py), and the FlashInfer sampling module (exercise/flashinfer_sampling.py, built beside the Triton
tasks). The processed paths (registry, mrv1) run on float32 logits."""

from __future__ import annotations

from ..family import About, Family, Task
from ..releases import Contact, stable

# The fake target's vLLM side and the batch classes every exercise shares (exercise/vllm_sampler.py: setup_platform,
# require_triton, sm_count, batch_classes).
SHARED = stable("vllm.platforms", "vllm.platforms.interface:DeviceCapability", "vllm.platforms.interface:Platform",
                "vllm.platforms.interface:PlatformEnum", "vllm.triton_utils:HAS_TRITON",
                "vllm.utils.platform_utils:num_compute_units", "vllm.v1.sample.ops.topk_topp_triton:_topp_split_count")
# vLLM 0.34 removed the V1 model runner (vllm/v1/worker/gpu_model_runner.py) and, with it, the V1 Sampler and
# RejectionSampler: Model Runner V2 is its only runner (VLLM_USE_V2_MODEL_RUNNER is gone).
V1_RUNNER_GONE = "vLLM 0.34 removed the V1 model runner, its Sampler and its rejection sampler"

EXERCISE = "kernelcache.exercise.vllm_sampler"
PROBE = "tests/probes/vllm_keys.py"


def max_batch(plan) -> int:
    """The largest batch a step samples: every sequence with all its drafts."""
    return plan.max_num_seqs * (plan.num_speculative_tokens + 1)


def processed(plan) -> bool:
    """Whether the plan has float32 logits, what the processed paths (top-k/top-p) sample."""
    return "float32" in plan.dtypes


class Registry(Family):
    name = "registry"
    exercise = f"{EXERCISE}:registry"
    about = About(
        "every top-k/top-p key vLLM's JIT warmup registry enumerates",
        ("vllm.model_executor.warmup.jit_warmup", "vLLM's JIT warmup registry"),
        reads=("vocab", "max_num_seqs", "num_speculative_tokens", "dtypes"), probe=PROBE, gpu_check="sampler",
        proven="H200", contacts=SHARED + stable("vllm.model_executor.warmup.jit_warmup:JitWarmupRegistry",
                                                "vllm.v1.sample.ops.topk_topp_sampler:register_top_k_top_p_warmups"))

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        if not processed(plan):
            return ()
        return (self.task({"vocab": vocab, "max_num_seqs": plan.max_num_seqs,
                           "num_speculative_tokens": plan.num_speculative_tokens}),)


class Mrv1(Family):
    name = "mrv1"
    exercise = f"{EXERCISE}:mrv1"
    about = About(
        "the V1 Sampler with seeded and unseeded requests, every batch class",
        ("vllm.v1.sample.sampler", "the V1 (MRV1) Sampler"),
        reads=("vocab", "max_num_seqs", "num_speculative_tokens", "modes", "seeded", "unseeded", "dtypes", "paths"),
        probe=PROBE, gpu_check="sampler", proven="H200", releases=("0.33",), lacks=V1_RUNNER_GONE,
        contacts=SHARED + tuple(Contact(c.name, c.symbol, ("0.33",)) for c in stable(
            "vllm.v1.sample.sampler:Sampler", "vllm.v1.sample.logits_processor:LogitsProcessors",
            "vllm.v1.sample.metadata:SamplingMetadata")))

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        if not processed(plan):
            return ()
        return (self.task({"vocab": vocab, "max_batch": max_batch(plan), "modes": list(plan.modes),
                           "seeded": plan.seeded, "unseeded": plan.unseeded and "flashinfer" not in plan.paths,
                           "dtypes": list(plan.dtypes)}),)


class Mrv2(Family):
    name = "mrv2"
    exercise = f"{EXERCISE}:mrv2"
    about = About(
        "Model Runner V2's temperature/min-p/top-k/top-p and Gumbel chain, raw-logits Gumbel",
        ("vllm.v1.worker.gpu.sample.gumbel", "Model Runner V2's Gumbel sampler"),
        reads=("vocab", "max_num_seqs", "num_speculative_tokens", "modes", "dtypes", "min_p", "fp64_gumbel"),
        probe=PROBE, gpu_check="sampler", proven="H200",
        contacts=SHARED + stable("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_top_p",
                                 "vllm.v1.worker.gpu.sample.gumbel:apply_temperature",
                                 "vllm.v1.worker.gpu.sample.gumbel:gumbel_sample",
                                 "vllm.v1.worker.gpu.sample.min_p:apply_min_p"))

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        # Every logits dtype is also a model dtype: an fp32 model's raw logits reach MRV2's Gumbel kernel with
        # APPLY_TEMPERATURE=True, a key of its own (seen missing on the H200 when only bf16/fp16 were raw).
        return (self.task({
            "vocab": vocab, "max_batch": max_batch(plan), "modes": list(plan.modes) if processed(plan) else [],
            "model_dtypes": list(plan.dtypes), "max_num_reqs": plan.max_num_seqs, "min_p": plan.min_p,
            "fp64_gumbel": plan.fp64_gumbel}),)


class FlashInferSampling(Family):
    """FlashInfer's sampling module: no Triton task; the build compiles the module (build.py)."""

    name = "flashinfer"
    exercise = f"{EXERCISE}:flashinfer"
    about = About(
        "FlashInfer's sampling module (a CUDA module, built beside the Triton tasks)",
        ("flashinfer", "flashinfer-python"), reads=("vocab",), proven="H200 (cross builds)",
        contacts=stable("vllm.v1.sample.ops.topk_topp_sampler:flashinfer_sample"))
    unit = ""
    flashinfer = "built"

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        return ()


REGISTRY, MRV1, MRV2, FLASHINFER = Registry(), Mrv1(), Mrv2(), FlashInferSampling()
