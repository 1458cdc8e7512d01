"""vLLM's own torch.compile of a served model, on a GPU that is not here (the ``compile`` path).

``python -m kernelcache.exercise.vllm_compile REQUEST`` (with ``fake_cuda_runtime``'s shim preloaded for ``build``):

* ``build``: vLLM's ``VllmConfig`` for the serve command (exercise/vllm_serve.py: vLLM's own parser and
  ``create_engine_config`` on the profile's platform), the model from ``initialize_model`` with FakeTensor weights
  on ``cuda`` (no memory), and its ``@support_torch_compile`` forward called once under ``set_forward_context`` with
  ``max_num_batched_tokens`` tokens, as the engine's profile run does. vLLM runs Dynamo (``aot_compile``),
  ``VllmBackend`` compiles each piece through Inductor, Triton compiles Inductor's kernels for the target, and vLLM
  saves the artifact under ``VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<hash>``; it then runs the
  compiled graph once, which fails without a device (reported, not raised).
* ``factors``: the same config, and what vLLM hashes into that directory's name (``aot_compile_hash_factors`` and
  ``_model_hash_key`` of the forward), named, for ``install``/``verify`` to compare with the bundle's record.

Where each step asks the device and what answers: exercise/fake_cuda_runtime.py and docs/ENGINE_COMPILE.md.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import traceback
from pathlib import Path
from typing import Any

LIBRARIES: list = []
EVENTS: dict[str, int] = {}


def count_compiles() -> None:
    """Every Triton compile (hit or miss) and gcc build, by Triton's own hooks, into ``EVENTS``."""
    import triton
    from triton.runtime import build as triton_build

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        name = "triton_cache_hit" if cache_hit else "triton_compile"
        EVENTS[name] = EVENTS.get(name, 0) + 1

    triton.knobs.compilation.listener = listener
    original = triton_build._build

    def counted(*args, **kwargs):
        EVENTS["gcc_build"] = EVENTS.get("gcc_build", 0) + 1
        return original(*args, **kwargs)

    triton_build._build = counted


def counters() -> dict:
    """vLLM's compilation counters and Dynamo's, as the load test reads them."""
    from torch._dynamo.utils import counters as dynamo
    from vllm.compilation.counter import compilation_counter

    return {"vllm_counters": {k: v for k, v in vars(compilation_counter).items() if v},
            "dynamo_stats": dict(dynamo["stats"]), "events": dict(EVENTS)}


def _profile_platform(profile: dict) -> None:
    import vllm.platforms

    from . import vllm_serve

    vllm_serve.PROFILE.clear()
    vllm_serve.PROFILE.update(profile)
    vllm.platforms._current_platform = vllm_serve.target_platform()
    vllm_serve.flash_attn_interface()


def served_config(args: list[str], shown: str) -> Any:
    """vLLM's ``VllmConfig`` for ``vllm serve ARGS``, its model string the served one (``shown``'s model: it is in
    ``ModelConfig.compute_hash``)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    from ..plan.serve import ServeCommand
    from . import vllm_serve

    vllm_serve._inspect_here()
    vllm_serve.capability_answers()
    parsed = vllm_serve._parse(args)
    config = AsyncEngineArgs.from_cli_args(parsed).create_engine_config(UsageContext.OPENAI_API_SERVER)
    config.model_config.model = ServeCommand.parse(shown).model
    return config


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def named_factors(config: Any) -> dict:
    """What vLLM 0.33 hashes into the AOT directory's name (vllm/compilation/decorators.py: ``sha256(str(
    aot_compile_hash_factors(config) + [_model_hash_key(forward)]))``), each part named, and what it is made of:
    the hashed ``VLLM_*`` values (``envs.compile_factors``), each sub-config's ``compute_hash`` and plain fields,
    the Python and torch versions the artifact records (torch ``SystemInfo``, checked at load)."""
    import torch
    import vllm
    import vllm.envs as envs
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(config):
        factors = [str(f) for f in aot_compile_hash_factors(config)]
    subs = {}
    for name in sorted(vars(config)):
        sub = getattr(config, name)
        if name.endswith("_config") and hasattr(sub, "compute_hash"):
            fields = {k: _plain(v) for k, v in sorted(vars(sub).items()) if not k.startswith("_")
                      and isinstance(v, (str, int, float, bool, type(None)))}
            try:
                digest, hashed = _hashed_fields(sub)
                subs[name] = {"hash": digest, "fields": {**fields, **hashed}}
            except Exception as exc:  # noqa: BLE001 -- a sub-config that cannot hash alone is named as such
                subs[name] = {"hash": f"unhashable: {exc}", "fields": fields}
    return {"factors": factors, "env": {k: _plain(v) for k, v in sorted(envs.compile_factors().items())},
            "configs": subs, "mega_artifact": bool(envs.VLLM_USE_MEGA_AOT_ARTIFACT),
            "python": platform.python_version(), "torch": torch.__version__, "vllm": vllm.__version__,
            "transformers": _version_of("transformers")}


def _version_of(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _hashed_fields(sub: Any) -> tuple[str, dict]:
    """``sub.compute_hash()`` and, for a config that hashes through vLLM's ``get_hash_factors``
    (vllm/config/utils.py: ModelConfig, CacheConfig, ...), each field it hashed as it normalized it (a dtype, a list,
    a dict included: what a plain-field comparison misses), its JSON text."""
    import vllm.config.utils as utils

    seen: list[dict] = []
    original = utils.get_hash_factors

    def recording(config: Any, *args: Any, **kwargs: Any) -> dict:
        out = original(config, *args, **kwargs)
        if config is sub:
            seen.append(out)
        return out

    utils.get_hash_factors = recording
    try:
        digest = sub.compute_hash()
    finally:
        utils.get_hash_factors = original
    hashed = seen[0] if seen else {}
    return digest, {k: v if isinstance(v, (str, int, float, bool, type(None))) else json.dumps(v, sort_keys=True,
                                                                                              default=str)
                    for k, v in hashed.items()}


def directory_key(config: Any, model_key: str) -> str:
    """The AOT directory's name as vLLM 0.33 makes it (vllm/compilation/decorators.py): the sha256 of ``str()`` of
    the factors as they are (with the mega artifact some are dicts, whose ``str`` is not their strings')."""
    import hashlib

    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(config):
        factors = list(aot_compile_hash_factors(config))
    return hashlib.sha256(str([*factors, model_key]).encode()).hexdigest()


def define_missing_c_ops() -> list[str]:
    """vLLM's compile passes name ``torch.ops._C`` ops at import (``passes/fusion/matcher_utils.py``:
    ``ROTARY_OP = torch.ops._C.rotary_embedding.default``, the norm and quant ops). Where vLLM's ``_C`` extension
    is absent (a pure-Python vLLM tree), each missing op of vllm_c_op_schemas.json (the schemas vLLM 0.33.0's
    extension registers) is defined with no kernel: naming it works, calling it fails loudly."""
    import torch

    schemas = json.loads(Path(__file__).with_name("vllm_c_op_schemas.json").read_text())
    library = torch.library.Library("_C", "FRAGMENT")
    defined = []
    for name, schema in sorted(schemas.items()):
        op, overload = name.rsplit(".", 1)
        if hasattr(torch.ops._C, op) and overload in getattr(torch.ops._C, op).overloads():
            continue
        library.define(schema)
        defined.append(name)
    LIBRARIES.append(library)  # a Library's definitions live as long as it does
    return defined


def substitutes() -> dict:
    """Stand-ins only where vLLM's compiled extensions are absent (exercise/fake_ops.py replaces a missing op or
    module; nothing on this path calls one)."""
    import vllm._custom_ops  # noqa: F401 -- vLLM's compiled ops load first where they are installed

    from . import fake_ops
    from .layers import install_ops

    done = fake_ops.install()
    done["ops"] += install_ops(fake_ops)
    done["schemas_only"] = define_missing_c_ops()
    return done


def fake_target(profile: dict) -> None:
    """Triton, torch's CUDA side and vLLM's platform answering for ``profile`` (GPU hidden)."""
    import importlib.util

    from . import fake_cuda_runtime
    from . import fake_target as target

    if not fake_cuda_runtime.shim_preloaded():
        raise RuntimeError(f"preload {fake_cuda_runtime.SHIM_NAME} (fake_cuda_runtime.build_cudart_shim)")
    capability = int(profile["arch"].removeprefix("sm_").rstrip("af"))
    memory = int(profile["memory_mib"]) * 1024 * 1024
    vllm_dir = os.path.dirname(importlib.util.find_spec("vllm").origin)
    target.activate(capability, profile["sm_count"], extra_symbols=fake_cuda_runtime.driver_symbols_of(vllm_dir),
                    definitions=fake_cuda_runtime.DRIVER_DEFINITIONS)
    fake_cuda_runtime.install(capability, profile["sm_count"], profile["product"], memory)
    fake_cuda_runtime.skip_compile_time_autotune()
    fake_cuda_runtime.combine_without_benchmark()


def build(request: dict) -> dict:
    """The ``build`` mode (module docstring); returns the report."""
    import torch

    from . import fake_cuda_runtime
    from .fake_device import fake_cuda
    from .layers import single_rank

    profile = request["profile"]
    fake_target(profile)
    count_compiles()
    _profile_platform(profile)
    report: dict = {"substituted": substitutes()}
    config = served_config(request["args"], request["shown"])
    single_rank()
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    tokens = config.scheduler_config.max_num_batched_tokens
    with set_default_torch_dtype(config.model_config.dtype), fake_cuda(), torch.device("cuda"):
        model = initialize_model(config)
        ids = torch.zeros(tokens, dtype=torch.int64, device="cuda")
        positions = torch.zeros(tokens, dtype=torch.int64, device="cuda")
    report["named"] = named_factors(config)
    report["named"]["model_hash_key"] = _model_key(model)
    report["named"]["key"] = directory_key(config, report["named"]["model_hash_key"])
    try:
        first_call(model, config, ids, positions)
    except Exception as exc:  # noqa: BLE001 -- vLLM runs the graph once after saving; no device runs it here
        report["after_save"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    root = Path(os.environ["VLLM_CACHE_ROOT"])
    report["artifacts"] = sorted(str(p.relative_to(root)) for p in root.rglob("rank_*/model"))
    report["tokens"] = tokens
    report.update(counters())
    report["left_out"] = left_out(len(fake_cuda_runtime.SKIPPED_AUTOTUNE_BLOCKS), fake_cuda_runtime.COMBO_DECISIONS)
    if not report["artifacts"]:
        raise RuntimeError(f"vLLM saved no AOT artifact ({report.get('after_save', 'the forward returned')})")
    return report


def left_out(autotune_blocks: int, combo_groups: list) -> list[dict]:
    """What a build without a GPU cannot make, as skipped records (``path``, ``reason``)."""
    out = [{"path": "compile/max-autotune", "reason": "Inductor's max-autotune and coordinate-descent tuning time "
            "candidate kernels on the GPU (vLLM leaves both off unless VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE / "
            "VLLM_ENABLE_INDUCTOR_COORDINATE_DESCENT_TUNING are set; a build with them set is refused)"},
           {"path": "compile/registers", "reason": "registers per kernel are read from the loaded cubin "
            "(StaticallyLaunchedCudaKernel.load_kernel): unknown here, so dynamic_scale_rblock adds no smaller "
            "RBLOCK config"}]
    if autotune_blocks:
        out.append({"path": "compile/autotune-at-compile-time", "reason": f"{autotune_blocks} compile-time autotune "
                    "block(s) launch kernels on the device (PythonWrapperCodegen.generate_and_run_autotune_block): "
                    "those kernels keep every config and benchmark at their first launch on the GPU (no compile)"})
    if combo_groups:
        out.append({"path": "compile/combo-kernel-benchmark", "reason": f"{len(combo_groups)} combo-kernel group(s) "
                    "combined without the GPU timing Inductor's benchmark_combo_kernel asks for"})
    return out


def _model_key(model: Any) -> str:
    from vllm.compilation.decorators import _model_hash_key

    return _model_hash_key(type(model.model).forward)


def first_call(model: Any, config: Any, ids: Any, positions: Any) -> Any:
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    with set_current_vllm_config(config), set_forward_context(None, config, num_tokens=ids.shape[0]):
        return model.model(ids, positions, None, None)


def factors(request: dict) -> dict:
    """The ``factors`` mode: the serving environment's values, vLLM's platform and torch's CUDA queries answering
    for the profile (the GPU hidden), so that a machine without the GPU computes what the GPU's server would (with
    the mega artifact Inductor's ``CacheBase.get_system`` hashes the product's name); whether the GPU here is the
    profile's product is install's GPU check (exit 21)."""
    from . import fake_cuda_runtime

    profile = request["profile"]
    capability = int(profile["arch"].removeprefix("sm_").rstrip("af"))
    fake_cuda_runtime.install(capability, profile["sm_count"], profile["product"],
                              int(profile["memory_mib"]) * 1024 * 1024)
    _profile_platform(profile)
    return {"named": named_factors(served_config(request["args"], request["shown"]))}


def main(request_file: str) -> int:
    request = json.loads(Path(request_file).read_text())
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # vllm/env_override.py's value, before Inductor's config
    try:
        report = build(request) if request["mode"] == "build" else factors(request)
        report["ok"] = True
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 -- the report says where it stopped
        report = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()}
    Path(request["answer"]).write_text(json.dumps(report, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
