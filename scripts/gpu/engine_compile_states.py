"""vLLM's own torch.compile of a dense Llama model, in one state per fresh process (issue 39).

``build``: compile on the fake target with the GPU hidden (``CUDA_VISIBLE_DEVICES=""``, kernelcache's fake Triton
driver, exercise/fake_cuda_runtime.py's answers; run it with that module's shim preloaded). The model's
``@support_torch_compile`` forward goes through vLLM's ``VllmBackend`` with AOT compile, as a server's first
(profile) run does, with FakeTensor weights; the artifact is saved before vLLM runs the compiled graph once, which
fails without a device and is reported, not raised.

``run``: the same forward on the GPU with seeded dummy weights, in a state set by the caller's VLLM_CACHE_ROOT:
cold (empty), warm (a second start on vLLM's own cache) or the CPU-built cache copied elsewhere under a fresh HOME.
Reported as JSON: Dynamo traces, Inductor compiles, AOT loads, Triton compiles and cache hits, gcc builds, the
compile phase's wall time (the first call, which compiles or loads and then runs), a second call, and the output's
digest (and, with ``--reference``, the largest difference from the reference output).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

EVENTS: Counter = Counter()
TIMES: dict = {}


def substitutes(report: dict) -> None:
    """Where vLLM's compiled extensions are absent (the device carries vLLM's pure-Python tree): kernelcache's
    stand-ins for the C ops vLLM calls at import and the modules it imports on CUDA (exercise/fake_ops.py: an op or
    module is replaced only when missing; none of them is called on this path, TRITON_ATTN selected)."""
    import vllm._custom_ops  # noqa: F401 -- loads vLLM's compiled ops where they are installed, before any stand-in

    from kernelcache.exercise import fake_ops
    from kernelcache.exercise.layers import install_ops
    from kernelcache.exercise.vllm_compile import define_missing_c_ops

    done = fake_ops.install()
    done["ops"] += install_ops(fake_ops)
    done["schemas_only"] = define_missing_c_ops()
    report["substituted"] = done


def main() -> int:
    # What `import vllm` sets (vllm/env_override.py), here before torch._inductor.config reads it at its import (the
    # fakes import Inductor first): Inductor compiles in this process, where the fake Triton driver is active.
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("build", "run"))
    parser.add_argument("--model", required=True, help="a directory holding config.json (the same path every state)")
    parser.add_argument("--out", required=True, help="JSON report")
    parser.add_argument("--tokens", type=int, default=2048, help="max_num_batched_tokens (the compile range's end)")
    parser.add_argument("--capability", type=int, default=90)
    parser.add_argument("--sm-count", type=int, default=132)
    parser.add_argument("--product", default="NVIDIA H100 80GB HBM3")
    parser.add_argument("--memory", type=int, default=85520809984)
    parser.add_argument("--reference", help="a run's saved output (.pt) to compare with")
    parser.add_argument("--save-output", help="where a run saves its output (.pt)")
    parser.add_argument("--serve", help="the serve command whose VllmConfig every state uses (as kernelcache's compile "
                                        "path builds it: exercise/vllm_compile.py served_config)")
    args = parser.parse_args()
    report: dict = {"mode": args.mode, "cache_root": os.environ.get("VLLM_CACHE_ROOT"), "home": os.environ.get("HOME")}
    started = time.perf_counter()
    try:
        if args.mode == "build":
            build(args, report)
        else:
            run(args, report)
        report["ok"] = True
    except BaseException as exc:  # noqa: BLE001 -- the report says where it stopped
        report["ok"] = False
        report["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        report["traceback"] = traceback.format_exc()[-6000:]
    report["seconds_total"] = round(time.perf_counter() - started, 2)
    report["events"] = dict(EVENTS)
    report.update(counters())
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "traceback"}, indent=1, default=str)[:3000])
    return 0 if report["ok"] else 1


def count_triton() -> None:
    """Every Triton compile() (hit or miss) and every gcc build of a helper module, by kernelcache's listener."""
    from kernelcache.hooks import kernelcache_listener

    kernelcache_listener.install(also=lambda record: EVENTS.update(["triton_cache_hit" if record["cache_hit"]
                                                                    else "triton_compile"]))
    kernelcache_listener.count_builds(also=lambda record: EVENTS.update(["gcc_build"]))


def counters() -> dict:
    out: dict = {}
    try:
        from torch._dynamo.utils import counters as dynamo
        from vllm.compilation.counter import compilation_counter

        out["vllm_counters"] = {k: v for k, v in vars(compilation_counter).items() if v}
        out["dynamo_stats"] = dict(dynamo["stats"])
        out["inductor_counters"] = {k: v for k, v in dynamo["inductor"].items()
                                    if "cache" in k or "compile" in k or "bundler" in k}
    except Exception as exc:  # noqa: BLE001
        out["counters_error"] = repr(exc)
    return out


def engine_config(args):
    if args.serve:
        return served(args.serve)
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=args.model, skip_tokenizer_init=True, load_format="dummy", max_model_len=2048,
                      max_num_batched_tokens=args.tokens, max_num_seqs=64, attention_backend="TRITON_ATTN",
                      ).create_engine_config()


def served(command: str):
    """vLLM's config for a serve command, as kernelcache's compile path makes it, vLLM's platform the GPU here (its
    capability answers the CUTLASS queries where vLLM's compiled ops are absent)."""
    import torch

    from kernelcache.exercise import vllm_serve
    from kernelcache.exercise.vllm_compile import served_config
    from kernelcache.plan.serve import ServeCommand

    if not vllm_serve.PROFILE:
        props = torch.cuda.get_device_properties(0)
        vllm_serve.PROFILE.update({"arch": f"sm_{props.major}{props.minor}", "product": props.name,
                                   "sm_count": props.multi_processor_count, "memory_mib": props.total_memory >> 20})
    vllm_serve.flash_attn_interface()
    parsed = ServeCommand.parse(command)
    return served_config(list(parsed.args), parsed.text)


def hash_factors(config) -> list:
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(config):
        return [str(f) for f in aot_compile_hash_factors(config)]


def target_platform(args) -> None:
    """vLLM's CUDA platform, answering for the product instead of asking the (hidden) device."""
    import vllm.platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    cap, product, memory, sms = args.capability, args.product, args.memory, args.sm_count

    class TargetCuda(CudaPlatform):
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(cap // 10, cap % 10)

        @classmethod
        def get_device_name(cls, device_id=0):
            return product

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return memory

        @classmethod
        def num_compute_units(cls, device_id=0):
            return sms

    vllm.platforms._current_platform = TargetCuda()


def build(args, report: dict) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["KERNELCACHE_TARGET_MODE"] = "cross"
    from kernelcache.exercise import fake_cuda_runtime, fake_target

    if not fake_cuda_runtime.shim_preloaded():
        raise RuntimeError(f"preload {fake_cuda_runtime.SHIM_NAME} (fake_cuda_runtime.build_cudart_shim)")
    import importlib.util

    vllm_dir = os.path.dirname(importlib.util.find_spec("vllm").origin)
    fake_target.activate(args.capability, args.sm_count, extra_symbols=fake_cuda_runtime.driver_symbols_of(vllm_dir),
                         definitions=fake_cuda_runtime.DRIVER_DEFINITIONS)
    fake_cuda_runtime.install(args.capability, args.sm_count, args.product, args.memory)
    fake_cuda_runtime.skip_compile_time_autotune()
    fake_cuda_runtime.combine_without_benchmark()
    count_triton()
    target_platform(args)
    substitutes(report)
    import torch

    from kernelcache.exercise.drivers import device_scope
    from kernelcache.exercise.layers import single_rank

    config = engine_config(args)
    report["factors"] = hash_factors(config)
    single_rank()
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_default_torch_dtype(config.model_config.dtype), device_scope(), torch.device("cuda"):
        model = initialize_model(config)
        ids = torch.zeros(args.tokens, dtype=torch.int64, device="cuda")
        positions = torch.zeros(args.tokens, dtype=torch.int64, device="cuda")
    try:
        first_call(model, config, ids, positions, report)
    except Exception as exc:  # noqa: BLE001 -- vLLM runs the graph once after saving; no device runs it here
        report["after_save"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        report["after_save_traceback"] = traceback.format_exc()[-5000:]
    saved = sorted(str(p) for p in Path(os.environ["VLLM_CACHE_ROOT"]).rglob("rank_*/model"))
    report["artifacts"] = saved
    report["autotune_blocks_skipped"] = len(fake_cuda_runtime.SKIPPED_AUTOTUNE_BLOCKS)
    report["combo_groups_combined_unbenchmarked"] = fake_cuda_runtime.COMBO_DECISIONS
    if not saved:
        raise RuntimeError("vLLM saved no AOT artifact")


def first_call(model, config, ids, positions, report: dict):
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    started = time.perf_counter()
    try:
        with set_current_vllm_config(config), set_forward_context(None, config, num_tokens=ids.shape[0]):
            out = model.model(ids, positions, None, None)
            sync()
            return out
    finally:
        report["compile_phase_s"] = round(time.perf_counter() - started, 3)


def sync() -> None:
    import torch

    if torch.cuda.is_available() and os.environ.get("KERNELCACHE_TARGET_MODE") != "cross":
        torch.cuda.synchronize()


def run(args, report: dict) -> None:
    count_triton()
    substitutes(report)
    import torch

    from kernelcache.exercise.layers import single_rank

    config = engine_config(args)
    report["factors"] = hash_factors(config)
    report["device"] = torch.cuda.get_device_name(0)
    single_rank()
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_default_torch_dtype(config.model_config.dtype), torch.device("cuda"):
        model = initialize_model(config)
    DummyModelLoader(config.load_config).load_weights(model, config.model_config)  # seeded (1234) per tensor
    generator = torch.Generator(device="cuda").manual_seed(7)
    vocab = config.model_config.get_vocab_size()
    ids = torch.randint(0, vocab, (args.tokens,), device="cuda", generator=generator)
    positions = torch.arange(args.tokens, device="cuda")
    with torch.inference_mode():
        out = first_call(model, config, ids, positions, report)
        started = time.perf_counter()
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import set_forward_context

        with set_current_vllm_config(config), set_forward_context(None, config, num_tokens=args.tokens):
            again = model.model(ids, positions, None, None)
        sync()
        report["second_call_s"] = round(time.perf_counter() - started, 4)
    host = out.float().cpu()
    report["output_sha256"] = hashlib.sha256(host.numpy().tobytes()).hexdigest()
    report["second_equal_first"] = bool(torch.equal(out, again))
    if args.save_output:
        torch.save(host, args.save_output)
    if args.reference and os.path.exists(args.reference):
        reference = torch.load(args.reference)
        report["max_abs_diff_vs_reference"] = float((host - reference).abs().max())
        report["equal_to_reference"] = bool(torch.equal(host, reference))


if __name__ == "__main__":
    sys.exit(main())
