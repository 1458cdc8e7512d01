"""Model Runner V2's own kernels (exercise/vllm_runner.py): its request state, input buffers, block tables and
sampler stepped through prefill and decode."""

from __future__ import annotations

from ..family import About, Family, ModelRole, Task
from ..releases import Contact, stable

# Model Runner V2's state objects and step functions (exercise/vllm_runner.py), as GPUModelRunner calls them.
CONTACTS = (
    # GPUModelRunner.initialize_kv_cache's block-table width: vllm/v1/worker/block_table.py until 0.33 (the V1
    # runner's module, gone with it in 0.34), vllm/v1/kv_cache_interface.py from 0.34.
    Contact("get_block_table_width", "vllm.v1.worker.block_table:get_block_table_width", ("0.33",)),
    Contact("get_block_table_width", "vllm.v1.kv_cache_interface:get_block_table_width", ("0.34",)),
    Contact("block_table_token_alignment", "vllm.v1.kv_cache_interface:AttentionSpec.block_table_token_alignment"),
) + stable(
    "vllm.sampling_params:SamplingParams", "vllm.triton_utils:triton", "vllm.utils.math_utils:cdiv",
    "vllm.utils.torch_utils:async_tensor_h2d", "vllm.v1.worker.gpu.block_table:BlockTables",
    "vllm.v1.worker.gpu.input_batch:InputBatch", "vllm.v1.worker.gpu.input_batch:InputBuffers",
    "vllm.v1.worker.gpu.input_batch:combine_sampled_and_draft_tokens", "vllm.v1.worker.gpu.input_batch:post_update",
    "vllm.v1.worker.gpu.input_batch:prepare_pos_seq_lens", "vllm.v1.worker.gpu.input_batch:prepare_prefill_inputs",
    "vllm.v1.worker.gpu.sample.prompt_logprob:PromptLogprobsWorker", "vllm.v1.worker.gpu.sample.sampler:Sampler",
    "vllm.v1.worker.gpu.states:RequestState", "vllm.v1.worker.gpu.structured_outputs:StructuredOutputsWorker",
    "vllm.v1.worker.gpu:buffer_utils")


class Runner(Family):
    name = "runner"
    exercise = "kernelcache.exercise.vllm_runner:runner"
    about = About(
        "Model Runner V2's own kernels: request state, input buffers, block tables, its sampler",
        ("vllm.v1.worker.gpu.input_batch", "Model Runner V2's input batch"),
        reads=("vocab", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "block_size", "dtypes"),
        note="Model Runner V2's own kernels", probe="tests/probes/runner_keys.py", gpu_check="runner",
        proven="H200", contacts=CONTACTS)
    model = ModelRole(rank=0)

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        return (self.task({
            "vocab": vocab, "max_num_seqs": plan.max_num_seqs, "max_model_len": plan.max_model_len,
            "max_num_batched_tokens": plan.max_num_batched_tokens, "block_size": plan.block_size,
            "dtypes": list(plan.dtypes)}),)

    def from_model(self, model, plan) -> bool:
        return True


FAMILY = Runner()
