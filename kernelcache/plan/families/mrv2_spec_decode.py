"""Model Runner V2's speculative decoding (exercise/vllm_mrv2_spec_decode.py): its rejection sampler, the
drafted sampler and the EAGLE speculator over warmup and drafted batches."""

from __future__ import annotations

from ..family import About, Family, Task
from ..releases import Contact, stable

# The runner's objects and steps as GPUModelRunner drives them with a speculator (exercise/
# vllm_mrv2_spec_decode.py); the runner family's contacts (plan/families/runner.py) too, through its helpers.
_REJECTION = "vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler.__call__"
CONTACTS = (
    # 0.33 masked the drafts a grammar bitmask left unchecked and passed the mask to the rejection sampler;
    # 0.34 dropped both.
    Contact("grammar_invalid_drafts", "vllm.v1.worker.gpu.structured_outputs:grammar_invalid_drafts", ("0.33",)),
    Contact("RejectionSampler.__call__", _REJECTION, ("0.33",),
            params=("self", "logits", "input_batch", "draft_logits", "invalid_drafts")),
    Contact("RejectionSampler.__call__", _REJECTION, ("0.34",), params=("self", "logits", "input_batch",
                                                                       "draft_logits")),
) + stable(
    "vllm.config.speculative:SpeculativeConfig", "vllm.utils.math_utils:cdiv",
    "vllm.utils.torch_utils:async_tensor_h2d", "vllm.v1.sample.ops.topk_topp_triton:_topp_split_count",
    "vllm.v1.worker.gpu.block_table:BlockTables", "vllm.v1.worker.gpu.input_batch:InputBatch",
    "vllm.v1.worker.gpu.input_batch:InputBuffers", "vllm.v1.worker.gpu.input_batch:combine_sampled_and_draft_tokens",
    "vllm.v1.worker.gpu.input_batch:expand_idx_mapping", "vllm.v1.worker.gpu.input_batch:post_update",
    "vllm.v1.worker.gpu.input_batch:prepare_pos_seq_lens", "vllm.v1.worker.gpu.input_batch:prepare_prefill_inputs",
    "vllm.v1.worker.gpu.sample.prompt_logprob:PromptLogprobsWorker", "vllm.v1.worker.gpu.sample.sampler:Sampler",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator.propose",
    "vllm.v1.worker.gpu.spec_decode:speculator", "vllm.v1.worker.gpu.spec_decode.speculator:_target_feeds_hc_residual",
    "vllm.v1.worker.gpu.states:RequestState", "vllm.v1.worker.gpu.structured_outputs:StructuredOutputsWorker")


class Mrv2SpecDecode(Family):
    name = "mrv2_spec_decode"
    exercise = "kernelcache.exercise.vllm_mrv2_spec_decode:mrv2_spec_decode"
    about = About(
        "Model Runner V2's rejection sampler, drafted sampler and EAGLE speculator",
        ("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "Model Runner V2's speculative decoding"),
        reads=("vocab", "max_num_seqs", "num_speculative_tokens", "max_model_len", "max_num_batched_tokens",
               "block_size", "dtypes"),
        note="need drafts", probe="tests/probes/mrv2_spec_decode_keys.py", gpu_check="mrv2_spec_decode",
        proven="H200", contacts=CONTACTS)
    needs_drafts = True

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        if plan.num_speculative_tokens < 1:
            return ()
        return (self.task({
            "vocab": vocab, "max_num_seqs": plan.max_num_seqs, "num_speculative_tokens": plan.num_speculative_tokens,
            "max_model_len": plan.max_model_len, "max_num_batched_tokens": plan.max_num_batched_tokens,
            "block_size": plan.block_size, "dtypes": list(plan.dtypes)}),)


FAMILY = Mrv2SpecDecode()
