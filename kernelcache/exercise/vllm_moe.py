"""Drive vLLM 0.33's fused-MoE layer so a build holds every Triton key an unquantized MoE model asks for.

One exercise task (see exercise/worker.py), ``moe``. It builds the experts with ``FusedMoEFactory`` as a
bf16/fp16 model on Hopper does (router, ``UnquantizedFusedMoEMethod``, the oracle's ``TritonExperts`` in a
``FusedMoEKernel``) and calls ``MoERunner.forward`` for every token count from 1 to ``max_num_batched_tokens``,
largest first as the profile run does. ``TritonExperts.apply`` picks the tile config from vLLM's tuned tables for
the device name (``try_get_optimal_moe_config``) and the block assignment (``_prepare_expert_assignment``), so
``fused_moe_kernel``'s keys follow ``M``; every ``M`` is run rather than deriving the classes. TP ``t`` is one
rank holding ``intermediate_size / t``.

Cross mode: FakeTensors on ``cuda``, the C ops and failing imports replaced by exercise/fake_ops.py, and the
layer calling ``_moe_forward`` (the Python body of ``vllm::moe_forward``) directly, as
``MoERunner._select_forward`` does on CPU. Native mode runs the same code on real tensors. Background:
docs/FAMILIES.md, "moe".
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from .drivers import cross, device_scope, require_triton

LAYER_NAME = "model.layers.0.mlp.experts"
DTYPES = ("bfloat16", "float16")


@dataclass
class MoELayer:
    """One fused-MoE layer as the model builds it, and the config it was built under."""

    runner: Any  # vllm.model_executor.layers.fused_moe.runner.moe_runner.MoERunner
    vllm_config: Any
    num_experts: int
    hidden_size: int
    top_k: int
    dtype: Any  # torch.dtype

    @property
    def method(self) -> Any:
        return self.runner.routed_experts.quant_method

    @property
    def weights(self) -> tuple[Any, Any]:
        experts = self.runner.routed_experts
        return experts.w13_weight, experts.w2_weight


def moe(num_experts: int, hidden_size: int, intermediate_size: int, top_k: int, dtype: str,
        max_num_batched_tokens: int, tensor_parallel_size: int = 1, entries: list[str] | None = None) -> dict:
    """Run each entry for every M in 1..max_num_batched_tokens; returns what ran and how.

    ``entries``: ``layer`` (the default: what MoE models built with ``FusedMoEFactory`` run) and/or
    ``fused_experts`` (vLLM's functional API, which MiniCPM's MoE, Moondream3 and Quark's static-int8 MoE
    call instead: its first GEMM passes ``topk_weights`` where the layer passes None, other keys).
    """
    started = time.perf_counter()
    entries = list(entries) if entries else ["layer"]
    check_arguments(intermediate_size, dtype, tensor_parallel_size, entries)
    substitutions = prepare()
    require_triton()
    with device_scope():
        layer = make_layer(num_experts, hidden_size, intermediate_size, top_k, dtype, tensor_parallel_size)
        substitutions["calls"] = python_bodies(layer, entries) if cross() else []
        start_workspace()
        m_values = [max_num_batched_tokens, *range(1, max_num_batched_tokens)]
        for entry in entries:
            for m in m_values:
                ENTRIES[entry](layer, *inputs(layer, m))
    return {**describe(layer, m_values), "entries": entries, "tensor_parallel_size": tensor_parallel_size,
            "substitutions": substitutions, "seconds": round(time.perf_counter() - started, 2)}


def check_arguments(intermediate_size: int, dtype: str, tensor_parallel_size: int, entries: list[str]) -> None:
    """Refuse what the layer cannot be built for, before anything is imported."""
    if dtype not in DTYPES:
        raise ValueError(f"moe: dtype must be one of {DTYPES}, got {dtype!r}")
    if tensor_parallel_size < 1 or intermediate_size % tensor_parallel_size:
        raise ValueError(f"moe: intermediate_size {intermediate_size} is not divisible by TP {tensor_parallel_size}")
    if set(entries) - set(ENTRIES):
        raise ValueError(f"moe: entries must be among {sorted(ENTRIES)}, got {entries}")


def prepare() -> dict:
    """Stand-ins for the C ops and imports this process lacks (exercise/fake_ops.py), before any import
    of vLLM's fused-MoE modules; the real ones are loaded first where they exist."""
    import vllm._custom_ops  # noqa: F401 -- loads vLLM's compiled ops where they are installed

    from . import device_tables, fake_ops

    done = fake_ops.install()
    from vllm.model_executor.layers.fused_moe import fused_moe

    device_tables.track(fused_moe, "get_moe_configs")  # the tile configs vLLM picks by device name
    return done


def make_layer(num_experts: int, hidden_size: int, intermediate_size: int, top_k: int, dtype: str,
               tensor_parallel_size: int = 1) -> MoELayer:
    """``FusedMoEFactory`` as Qwen3-MoE calls it (softmax routing, renormalised), weights post-processed as
    the model loader does (``process_weights_after_loading``); on ``cuda``, as the model is built."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory

    check_arguments(intermediate_size, dtype, tensor_parallel_size, ["layer"])
    config = VllmConfig()
    with set_current_vllm_config(config), torch.device("cuda"):
        runner = FusedMoEFactory(num_experts=num_experts, top_k=top_k, hidden_size=hidden_size,
                                 intermediate_size=intermediate_size // tensor_parallel_size,
                                 params_dtype=getattr(torch, dtype), renormalize=True, tp_size=1, dp_size=1,
                                 pcp_size=1, prefix=LAYER_NAME)
        for _, module in runner.named_modules():
            method = getattr(module, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(module)
    return MoELayer(runner, config, num_experts, hidden_size, top_k, getattr(torch, dtype))


def python_bodies(layer: MoELayer, entries: list[str]) -> list[dict]:
    """Cross mode: call the Python bodies of the custom ops the entries go through (module docstring)."""
    from vllm.model_executor.layers.fused_moe.runner import moe_runner

    why = "under FakeTensorMode the custom op runs its fake impl, which launches no kernel"
    done = []
    if "layer" in entries:
        layer.runner._forward_entry = moe_runner._moe_forward
        done.append({"call": "torch.ops.vllm.moe_forward", "by": "moe_runner._moe_forward (the op's Python body)",
                     "why": why})
    if "fused_experts" in entries:
        done.append({"call": "torch.ops.vllm.fused_experts",
                     "by": "fused_moe.fused_experts_impl (the op's Python body)", "why": why})
    return done


def start_workspace() -> None:
    """The worker's workspace manager (``Worker._init_workspace_and_model_runner``), on ``cuda``, if none exists yet."""
    import torch
    from vllm.v1.worker import workspace

    if not workspace.is_workspace_manager_initialized():
        workspace.init_workspace_manager(torch.device("cuda"))


def inputs(layer: MoELayer, m: int) -> tuple[Any, Any]:
    """Hidden states ``[m, hidden]`` in the model dtype and router logits ``[m, E]`` (what the gate returns)."""
    import torch

    hidden = torch.randn((m, layer.hidden_size), dtype=layer.dtype, device="cuda")
    logits = torch.randn((m, layer.num_experts), dtype=layer.dtype, device="cuda")
    return hidden, logits


def forward(layer: MoELayer, hidden: Any, logits: Any) -> Any:
    """``MoERunner.forward`` under the layer's config and a forward context, as the model runner calls it."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    with set_current_vllm_config(layer.vllm_config), set_forward_context(None, layer.vllm_config):
        return layer.runner.forward(hidden, logits)


def functional(layer: MoELayer, hidden: Any, logits: Any) -> Any:
    """vLLM's functional API on the layer's weights, as ``MiniCPMMoE.forward`` calls it: ``fused_topk``,
    then ``fused_experts`` (in cross mode its op body ``fused_experts_impl``)."""
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts, fused_experts_impl
    from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk

    weights, ids, _ = fused_topk(hidden, logits, layer.top_k, renormalize=True)
    w13, w2 = layer.weights
    if cross():
        return fused_experts_impl(hidden, w13, w2, weights, ids)
    return fused_experts(hidden, w13, w2, weights, ids)


ENTRIES = {"layer": forward, "fused_experts": functional}


def describe(layer: MoELayer, m_values: list[int]) -> dict:
    """What vLLM chose for this layer: backend, kernel classes, the tuned-config file and tile configs."""
    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name, try_get_optimal_moe_config

    method = layer.method
    kernel = method.moe_kernel
    w13, w2 = layer.weights
    num_experts, n = w2.shape[0], w2.shape[2]
    configs = {m: try_get_optimal_moe_config(tuple(w13.shape), tuple(w2.shape), layer.top_k, None, m)
               for m in m_values}
    distinct = {tuple(sorted(c.items())) for c in configs.values()}
    naive = [m for m in m_values if m * layer.top_k * 4 <= num_experts]
    return {"entry": "vllm.model_executor.layers.fused_moe.layer.FusedMoEFactory -> MoERunner.forward",
            "backend": method.unquantized_backend.value, "experts": type(kernel.fused_experts).__name__,
            "prepare_finalize": type(kernel.prepare_finalize).__name__,
            "w13": list(w13.shape), "w2": list(w2.shape), "dtype": str(layer.dtype).removeprefix("torch."),
            "m_values": len(m_values), "m_max": max(m_values), "naive_block_assignment_m": naive,
            "tuned_config": tuned_config_file(get_config_file_name(num_experts, n, None)),
            "tile_configs": len(distinct)}


def tuned_config_file(name: str) -> str:
    """The file ``get_moe_configs`` reads (``get_config_file_name``; ``VLLM_TUNED_CONFIG_FOLDER`` first, then
    vLLM's configs/), or ``default (no <name>)`` when vLLM falls back to ``get_default_config``."""
    import vllm.model_executor.layers.fused_moe.fused_moe as fused_moe

    folders = [os.environ.get("VLLM_TUNED_CONFIG_FOLDER"),
               os.path.join(os.path.dirname(os.path.realpath(fused_moe.__file__)), "configs")]
    for folder in folders:
        # isfile, not exists: exercise/device_tables.py logs exists() lookups of device-keyed files as vLLM's
        if folder and os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name).split("site-packages/")[-1]
    return f"default (no {name})"
