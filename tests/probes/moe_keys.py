"""Independent probe: the Triton keys vLLM 0.33's fused-MoE layer asks for, under the fake target.

Written without kernelcache's MoE exercise code (only its fake driver, fake CUDA tensors and C-op stand-ins,
"the same fake target"): its own CUDA platform (the probes' minimal one plus the device name and capability
the MoE oracle and tuned-config lookup read), and vLLM's entry points called on a seeded random sweep of
token counts in 1..MAX_M, each entry on a fresh in-memory cache (every key it needs is a compile() call):

* ``layer``: the layer as Qwen3-MoE builds it, gate included (``FusedMoEFactory(gate=GateLinear)``, router
  logits computed by the runner), called as the ``vllm::moe_forward`` op's Python body does;
* ``fused_experts``: ``fused_experts_impl``, the body of ``torch.ops.vllm.fused_experts`` (its own buffer
  allocation, no workspace manager), on ``fused_topk`` routing.

Prints one JSON line per compile() call: {"entry", "name", "key", "hit"}.

    python moe_keys.py CAPABILITY SM_COUNT PRODUCT E HIDDEN INTERMEDIATE TOP_K DTYPE MAX_M [M ...]

With explicit M values only those are run (both entries).
"""

import json
import random
import socket
import sys

import probe_target  # this folder: the fake target, a CUDA platform, the compile log

capability, sm_count = int(sys.argv[1]), int(sys.argv[2])
product = sys.argv[3]
num_experts, hidden, intermediate, top_k = map(int, sys.argv[4:8])
dtype_name, max_m = sys.argv[8], int(sys.argv[9])
explicit = [int(m) for m in sys.argv[10:]]
events = probe_target.start(capability, sm_count)

import torch  # noqa: E402
import triton  # noqa: E402
import vllm.platforms  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402

from kernelcache.exercise import fake_ops  # noqa: E402
from kernelcache.exercise.fake_device import fake_cuda  # noqa: E402


class MoEProbeCuda(type(vllm.platforms._current_platform)):
    @classmethod
    def get_device_capability(cls, device_id=0):
        return DeviceCapability(capability // 10, capability % 10)

    @classmethod
    def get_device_name(cls, device_id=0):
        return product


vllm.platforms._current_platform = MoEProbeCuda()
import vllm._custom_ops  # noqa: E402, F401

fake_ops.install()

from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import init_distributed_environment, initialize_model_parallel  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts_impl  # noqa: E402
from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory  # noqa: E402
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk  # noqa: E402
from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear  # noqa: E402
from vllm.model_executor.layers.fused_moe.runner import moe_runner  # noqa: E402
from vllm.v1.worker.workspace import init_workspace_manager  # noqa: E402

dtype = getattr(torch, dtype_name)
rng = random.Random(20261204)
compiled_fns = set()
previous = triton.knobs.compilation.listener


def remember(*, src, metadata, metadata_group, times, cache_hit):
    compiled_fns.add(src.fn)
    previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)


triton.knobs.compilation.listener = remember


def sweep() -> list[int]:
    if explicit:
        return explicit
    picks = rng.sample(range(1, max_m + 1), min(max_m, 160))
    return sorted({1, 2, 3, 4, 5, max_m, *picks}, key=lambda _: rng.random())


def forget() -> None:
    """Drop the in-memory kernels, so the next entry's launches go through compile() again."""
    for fn in compiled_fns:
        fn.device_caches.clear()


def single_rank(config) -> None:
    """A one-process world (gloo), so the layers ask vLLM's own groups for their TP/DP/PCP sizes."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with set_current_vllm_config(config):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        initialize_model_parallel(1)


def run_layer(config) -> object:
    with set_current_vllm_config(config), torch.device("cuda"):
        gate = GateLinear(hidden, num_experts, quant_config=None, prefix="model.layers.3.mlp.gate")
        runner = FusedMoEFactory(num_experts=num_experts, top_k=top_k, hidden_size=hidden,
                                 intermediate_size=intermediate, params_dtype=dtype, renormalize=True, gate=gate,
                                 prefix="model.layers.3.mlp.experts")
        for module in runner.modules():
            if getattr(module, "quant_method", None) is not None:
                module.quant_method.process_weights_after_loading(module)
    runner._forward_entry = moe_runner._moe_forward
    init_workspace_manager(torch.device("cuda"))
    for m in sweep():
        x = torch.empty((m, hidden), dtype=dtype, device="cuda")
        with set_current_vllm_config(config), set_forward_context(None, config):
            runner.forward(hidden_states=x, router_logits=x)
    return runner


def run_fused_experts(runner) -> None:
    w13, w2 = runner.routed_experts.w13_weight, runner.routed_experts.w2_weight
    for m in sweep():
        x = torch.empty((m, hidden), dtype=dtype, device="cuda")
        logits = torch.empty((m, num_experts), dtype=torch.float32, device="cuda")
        weights, ids, _ = fused_topk(x, logits, top_k, renormalize=True)
        fused_experts_impl(x, w13, w2, weights, ids)


def tagged(entry: str, start: int) -> list[dict]:
    return [{"entry": entry, **event} for event in events[start:]]


config = VllmConfig()
single_rank(config)  # real tensors: the groups' setup reads values
with fake_cuda():
    runner = run_layer(config)
    found = tagged("layer", 0)
    forget()
    start = len(events)
    run_fused_experts(runner)
    found += tagged("fused_experts", start)
for event in found:
    print(json.dumps(event))
