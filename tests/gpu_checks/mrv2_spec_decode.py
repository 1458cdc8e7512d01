"""The mrv2_spec_decode check on a GPU (scripts/gpu/prove.py mrv2_spec_decode): Model Runner V2's speculative
decoding on real tensors.

It runs ``kernelcache.exercise.vllm_mrv2_spec_decode.mrv2_spec_decode`` natively with the bundle's task: vLLM's
own RequestState, Sampler, RejectionSampler and EAGLE speculator (``propose``) on real CUDA tensors, the draft
model's forward and logits stubbed with seeded random tensors (the exercise's ``STUBS``), the UVA device view from
``fake_runner_ops.uva_view`` where vLLM's C extension is absent, and fake_ops' stand-ins for the import-time C-op
queries. Through the exercise's watch points (exercise/watch.py) it times every drafted step (a step that
verifies drafts, then proposes) and keeps, as outputs, every token the sampler and the rejection sampler returned
with their accepted counts, and every draft the speculator proposed (torch seeded; vLLM's Gumbel sampling is
seeded per request).
"""

from __future__ import annotations

import time


def check(tasks: list[dict], records: list[dict]) -> dict:
    import torch

    from kernelcache.exercise.vllm_mrv2_spec_decode import mrv2_spec_decode
    from kernelcache.exercise.watch import watching

    torch.manual_seed(0)
    outputs: dict = {}
    drafted: list[float] = []
    marks: list[float] = []

    def watch(point: str, values: dict) -> None:
        if point == "mrv2_spec_decode.step":
            torch.cuda.synchronize()
            marks.append(time.perf_counter())
        elif point == "mrv2_spec_decode.sampled":
            n = len(outputs) // 3
            outputs[f"{n:04d}:sampled"] = values["output"].sampled_token_ids.cpu()
            outputs[f"{n:04d}:num_sampled"] = values["output"].num_sampled.cpu()
        elif point == "mrv2_spec_decode.proposed":
            state, batch = values["state"], values["batch"]
            outputs[f"{len(outputs) // 3:04d}:drafts"] = state.req_states.draft_tokens[batch.idx_mapping].cpu()
        elif point == "mrv2_spec_decode.stepped" and any(values["drafts"]):
            torch.cuda.synchronize()
            drafted.append(time.perf_counter() - marks[-1])

    with watching(watch):
        summary = mrv2_spec_decode(**tasks[0]["kwargs"])
    return {"summary": {k: summary[k] for k in ("calls", "layouts", "c_ops_faked", "import_fakes", "stubbed")},
            "drafted_steps": len(drafted), "first_drafted_step_s": drafted[0] if drafted else None,
            "outputs": outputs}
