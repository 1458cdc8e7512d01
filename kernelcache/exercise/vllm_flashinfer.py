"""Drive vLLM 0.33's FlashInfer attention backend and record every FlashInfer JIT module it would build.

One exercise task, ``flashinfer_attention``. What a server started with ``--attention-backend FLASHINFER`` (or
``auto`` on Blackwell) runs for each decoder attention layer: the ``Attention`` layer built with
``FlashInferBackend``, its ``FlashInferImpl``, the KV cache in the layout the engine resolves for it, and each
step ``FlashInferMetadataBuilder.build`` (which calls the wrappers' ``plan()``), then ``Attention.forward``
(the wrappers' ``run()``, or the XQA / trtllm-gen entry points), over CUDA-graph capture, decode, prefill and
mixed batches (a few of each: FlashInfer's module URIs do not depend on the batch size).

FlashInfer builds a module through ``JitSpec.build_and_load`` (flashinfer/jit/core.py): its Python code
generates the sources (templated ones into its ``generated`` dir) and returns a ``JitSpec`` whose ``name``
is the module's URI. In cross mode this task replaces ``build_and_load`` for the duration of the run: it records
the spec (URI, sources inside the flashinfer package, which FlashInfer function asked for it, the first batch kind
that did) and hands back a stand-in module whose functions do nothing (a ``plan`` function returns a zero
plan-info vector), so ``plan()`` and ``run()`` go on. In a build (``BUILD_VARIABLE``) each recorded nvcc spec is
then built for the target by FlashInfer's own ``JitSpec.build`` in this process; FlashInfer's environment decides
the arch (``FLASHINFER_CUDA_ARCH_LIST``), the toolkit (``CUDA_HOME``) and where it builds
(``FLASHINFER_WORKSPACE_BASE``: exercise/flashinfer_sampling.py ``workspace_dir``, kept between builds). The built
module records its sources: its own and every FlashInfer header (``data/csrc``, ``data/include``) ninja saw it read.
In native mode (a GPU) FlashInfer builds and loads for real and the task only records.

What FlashInfer does not build with nvcc is recorded as left out, with the reason:

* trtllm-gen's files (``get_artifact`` in flashinfer/jit/cubin_loader.py: its ``checksums.txt``, its
  ``flashInferMetaInfo.h``, its cubins), downloaded at run time from NVIDIA's artifactory
  (``FLASHINFER_CUBINS_REPOSITORY``) or taken from flashinfer-cubin; and the module that launches them
  (``fmha_gen``), whose build includes that downloaded header (its include dir lies in ``FLASHINFER_CUBIN_DIR``).
* specs of other toolchains (``JitSpecCuteDsl``: CuTe-DSL kernels compiled by the DSL at run time).

vLLM decides between FlashInfer's own kernels and NVIDIA's (XQA decode on SM90 and SM12x, trtllm-gen on
SM100) by whether the serving host reaches NVIDIA's artifactory or has flashinfer-cubin installed
(``supports_trtllm_attention`` -> ``has_nvidia_artifactory`` in vllm/utils/flashinfer.py); ``cubins``
states which, since no network is asked here.

Cross mode (exercise/fake_device.py): FakeTensors on ``cuda``, host tensors real (the builder reads them back);
the CUDA queries FlashInfer and vLLM make directly (``torch.cuda.get_device_capability`` /
``get_device_properties`` / ``device``, ``torch.version.cuda``) answer the target's; vLLM's cache write
(``_C_cache_ops.reshape_and_cache_flash``) is the stand-in of exercise/fake_ops.py when vLLM's C extension is
absent. The builder's Triton kernel (``_copy_page_indices_kernel``, run wherever FlashInfer's own paged kernels
are) compiles as any other, into the bundle.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ..format.fingerprint import flashinfer_sources_digest as sources_digest
from . import vllm_attention as triton_attention
from .drivers import cross, device_scope
from .vllm_attention import Batch, Shape

LAYER_NAME = triton_attention.LAYER_NAME
KINDS = ("capture", "decode", "prefill", "mixed")  # the batch kinds of ``sweeps``, in run order
BUILD_VARIABLE = "KERNELCACHE_FLASHINFER_BUILD"  # "1": a build's exercise process nvcc-builds what it records
# The user's own CC ("": none) while FlashInfer builds: the exercise process's CC is a per-build wrapper for Triton's
# gcc step (exercise/jobs.py reproducible_cc), and FlashInfer passes CC to nvcc as -ccbin, which would make ninja
# rebuild every module in the kept workspace on every build.
CC_VARIABLE = "KERNELCACHE_FLASHINFER_CC"
DTYPES = ("bfloat16", "float16")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class SpecRecord:
    """One FlashInfer JIT module the backend asked for: its URI, how it is built and why it was asked for."""

    name: str  # the module's URI: <name>/<name>.so in a JIT dir or a jit-cache provider
    kind: str  # "nvcc" (JitSpecNvcc) or the spec class of another toolchain
    sources: tuple[str, ...]  # its sources inside the flashinfer package ("flashinfer/data/csrc/xqa/mha.cu")
    sources_sha256: str  # sources_digest of those: what install checks against the FlashInfer it finds
    generated: tuple[str, ...]  # its sources FlashInfer generated from templates (under its generated dir)
    why: str  # the FlashInfer function whose call built it (e.g. "get_batch_prefill_module")
    first_batch: str = ""  # the batch kind that first asked for it (capture, decode, prefill, mixed)


@dataclass
class Recorder:
    """What one run asked FlashInfer for."""

    specs: dict[str, SpecRecord] = field(default_factory=dict)
    live: dict[str, Any] = field(default_factory=dict)  # URI -> the JitSpec itself (to build it)
    left_out: dict[str, str] = field(default_factory=dict)  # what FlashInfer would fetch or not nvcc-build
    batch: str = ""

    def add(self, spec: Any, why: str) -> None:
        name = str(spec.name)
        if name in self.specs:
            return
        package = _package_root()
        sources = [Path(s) for s in getattr(spec, "sources", ()) or ()]
        inside = tuple(_relative(s, package) for s in sources if package in Path(s).resolve().parents)
        generated = tuple(s.name for s in sources if package not in Path(s).resolve().parents)
        kind = "nvcc" if type(spec).__name__ == "JitSpecNvcc" else type(spec).__name__
        self.specs[name] = SpecRecord(name, kind, inside, sources_digest(inside, package.parent), generated, why,
                                      self.batch)
        self.live[name] = spec
        if kind != "nvcc":
            self.left_out[name] = f"a {kind} module: compiled by its own toolchain at run time, not by nvcc"

    def buildable(self) -> list[str]:
        """The recorded modules nvcc builds here: nvcc specs not left out."""
        return [n for n, s in self.specs.items() if s.kind == "nvcc" and n not in self.left_out]


def _package_root() -> Path:
    import flashinfer

    return Path(flashinfer.__file__).resolve().parent


def _relative(source: Path, package: Path) -> str:
    """``flashinfer/data/csrc/...``: a source inside the package, relative to the package's parent."""
    return Path(source).resolve().relative_to(package.parent).as_posix()


PLAN_INFO_LENGTH = 16  # a plan() result's length: the wrappers only pass it back to run()


class StandIn:
    """What ``build_and_load`` hands back while recording: every function of the module does nothing, and a
    ``plan`` function returns a plan-info vector of zeros (the wrappers check it is not None and pass it on)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _plan if "plan" in attr else _nothing


def _caller() -> str:
    """The FlashInfer function that called ``build_and_load`` (frames only: no source is read, timings stay)."""
    import sys

    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name in ("build_and_load", "_build_and_load_jit_fallback"):
        frame = frame.f_back
    return frame.f_code.co_name if frame is not None else "?"


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _plan(*args: Any, **kwargs: Any) -> list[int]:
    return [0] * PLAN_INFO_LENGTH


ARTIFACT = ("a trtllm-gen file FlashInfer downloads from NVIDIA's artifactory (FLASHINFER_CUBINS_REPOSITORY) or "
            "takes from flashinfer-cubin at run time; not built by nvcc")
NEEDS_ARTIFACTS = ("its build includes headers FlashInfer downloads from NVIDIA's artifactory (trtllm-gen's "
                   "metainfo, under FLASHINFER_CUBIN_DIR), and it loads downloaded cubins at run time")
# Where FlashInfer's Python code takes the artifact functions from (``from ..cubin_loader import get_artifact``):
# the downloads, and ``setup_cubin_loader``, which hands a built module the loader of downloaded cubins.
ARTIFACT_USERS = ("flashinfer.jit.cubin_loader", "flashinfer.jit.attention.modules", "flashinfer.jit",
                  "flashinfer.prefill", "flashinfer.decode")


@contextlib.contextmanager
def recording(recorder: Recorder, stand_in: bool = True):
    """``JitSpec.build_and_load`` records each spec; with ``stand_in`` (cross mode) it returns a stand-in instead of
    building, and artifact downloads are recorded as left out and answer placeholder bytes (a module whose build
    includes one is left out: ``NEEDS_ARTIFACTS``). Without, FlashInfer builds, downloads and loads for real."""
    import importlib

    from flashinfer.jit import core
    from flashinfer.jit import env as jit_env

    cubin_dir = Path(jit_env.FLASHINFER_CUBIN_DIR)

    def build_and_load(spec):
        recorder.add(spec, _caller())
        includes = [Path(p) for p in getattr(spec, "extra_include_dirs", None) or ()]
        if any(p == cubin_dir or cubin_dir in p.parents for p in includes):
            recorder.left_out[spec.name] = NEEDS_ARTIFACTS
        return StandIn(spec.name) if stand_in else original(spec)

    def get_artifact(file_name: str, *args: Any, **kwargs: Any) -> bytes:
        recorder.left_out[f"artifact:{file_name}"] = ARTIFACT
        return b"kernelcache: not downloaded"

    def get_meta_hash(*args: Any, **kwargs: Any) -> str:
        return "0" * 64

    original = core.JitSpec.build_and_load
    replaced = [(core.JitSpec, "build_and_load", build_and_load)]
    stand_ins = (("get_artifact", get_artifact), ("get_meta_hash", get_meta_hash), ("setup_cubin_loader", _nothing))
    for module in map(importlib.import_module, ARTIFACT_USERS if stand_in else ()):
        replaced += [(module, n, f) for n, f in stand_ins if hasattr(module, n)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in replaced]
    for owner, name, function in replaced:
        setattr(owner, name, function)
    try:
        yield recorder
    finally:
        for owner, name, function in saved:
            setattr(owner, name, function)

# -- the task -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlashInferShape(Shape):
    """One rank's attention as the FlashInfer backend sees it: ``Shape`` plus the logits soft-cap (0: none)."""

    logits_soft_cap: float = 0.0


@dataclass
class FlashInferState:
    """One FLASHINFER attention layer with its KV cache, metadata builder and the runner's input buffers."""

    shape: FlashInferShape
    config: Any
    layer: Any
    builder: Any
    kv_cache: Any
    block_table: Any
    query_start_loc: Any
    seq_lens: Any
    slot_mapping: Any
    num_blocks: int
    recorder: Recorder
    calls: dict = field(default_factory=dict)

    @property
    def width(self) -> int:
        return self.block_table.shape[1]


def flashinfer_attention(*, num_heads: int, num_kv_heads: int, head_size: int, dtype: str,
                         kv_cache_dtype: str = "auto", block_size: int = 16, max_num_seqs: int = 256,
                         max_model_len: int = 8192, max_num_batched_tokens: int = 8192, sliding_window: int = 0,
                         logits_soft_cap: float = 0.0, tensor_parallel_size: int = 1,
                         attention_backend: str = "FLASHINFER", cubins: bool = True, cuda: str = "13.0",
                         build: bool | None = None, kinds: list[str] | None = None) -> dict:
    """Capture, decode, prefill and mixed batches through one FLASHINFER layer (module docstring); the FlashInfer
    JIT modules they asked for and, with ``build`` (default: ``BUILD_VARIABLE`` is "1"), those modules built for the
    target.

    ``cubins``: whether the serving host reaches NVIDIA's artifactory or has flashinfer-cubin (vLLM then decodes
    with XQA on SM90/SM12x and runs trtllm-gen on SM100). ``attention_backend``: FLASHINFER, or auto (the task
    runs only where vLLM's CUDA platform puts FLASHINFER first). ``kinds``: the batch kinds to run (default:
    all of ``KINDS``). ``cuda``: the CUDA version of the serving torch
    (``torch.version.cuda``), which FlashInfer reads to pick FA3 on SM90. In native mode FlashInfer builds and
    runs each module for real; ``built`` then names what its JIT built.
    """
    started = time.perf_counter()
    shape = rank_shape(num_heads, num_kv_heads, head_size, dtype, kv_cache_dtype, block_size, max_num_seqs,
                       max_model_len, max_num_batched_tokens, sliding_window, logits_soft_cap, tensor_parallel_size)
    if set(kinds or ()) - set(KINDS):
        raise ValueError(f"flashinfer_attention: kinds must be among {KINDS}, got {kinds}")
    substitutions = prepare()
    summary = {"rank_shape": asdict(shape), "cubins": cubins, "attention_backend": attention_backend}
    chosen = chosen_backend(attention_backend)
    if chosen != "FLASHINFER":
        return {**summary, "backend": chosen, "modules": [], "left_out": {}, "built": {},
                "seconds": round(time.perf_counter() - started, 2)}
    recorder = Recorder()
    with device_scope(), host_tensors(), target_queries(cuda) as faked, artifactory(cubins), \
            recording(recorder, stand_in=cross()):
        state = make_state(shape, recorder)
        for kind, batches in sweeps(state):
            if kinds and kind not in kinds:
                continue
            recorder.batch = kind
            for batch in batches:
                run(state, kind, batch)
    build = os.environ.get(BUILD_VARIABLE) == "1" if build is None else build
    built = build_specs(recorder) if build else jit_built(recorder)
    return {**summary, "backend": "FLASHINFER", "decode_kernel": describe_decode(state.builder),
            "calls": state.calls, "modules": [asdict(s) for s in recorder.specs.values()],
            "left_out": dict(sorted(recorder.left_out.items())), "built": built,
            "substitutions": {**substitutions, "torch_cuda": faked}, "seconds": round(time.perf_counter() - started, 2)}


def chosen_backend(attention_backend: str) -> str:
    """The backend vLLM serves with: the one named, or for auto the first of vLLM's CUDA priorities for the
    platform's capability (``_get_backend_priorities`` in vllm/platforms/cuda.py; FLASHINFER on SM100)."""
    if attention_backend != "auto":
        return attention_backend
    import importlib
    import sys
    import types

    from vllm.platforms import current_platform

    try:  # vllm/platforms/cuda.py imports vLLM's stable-ABI extension, which needs the driver; nothing here calls it
        importlib.import_module("vllm._C_stable_libtorch")
    except ImportError:
        sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    from vllm.platforms.cuda import _get_backend_priorities

    return _get_backend_priorities(False, current_platform.get_device_capability())[0].name


def rank_shape(num_heads: int, num_kv_heads: int, head_size: int, dtype: str, kv_cache_dtype: str, block_size: int,
               max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int, sliding_window: int,
               logits_soft_cap: float, tensor_parallel_size: int) -> FlashInferShape:
    """Check the arguments before anything is imported; one rank's heads as vLLM shards them."""
    tp = tensor_parallel_size
    if dtype not in DTYPES:
        raise ValueError(f"flashinfer_attention: dtype must be one of {DTYPES}, got {dtype!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"flashinfer_attention: kv_cache_dtype must be one of {KV_CACHE_DTYPES}, "
                         f"got {kv_cache_dtype!r}")
    if tp < 1 or num_heads % tp or num_heads % num_kv_heads or (num_kv_heads % tp and tp % num_kv_heads):
        raise ValueError(f"flashinfer_attention: {num_heads} heads / {num_kv_heads} KV heads cannot be split "
                         f"over TP {tp}")
    if head_size not in (64, 128, 256, 512):
        raise ValueError("flashinfer_attention: FlashInfer's backend serves head sizes 64, 128, 256 and 512 "
                         "(FlashInferBackend.get_supported_head_sizes)")
    if min(block_size, max_num_seqs, max_model_len, max_num_batched_tokens) < 1 or sliding_window < 0 or \
            logits_soft_cap < 0:
        raise ValueError("flashinfer_attention: sizes must be positive, sliding_window and logits_soft_cap >= 0")
    return FlashInferShape(num_heads // tp, max(1, num_kv_heads // tp), head_size, dtype, kv_cache_dtype,
                           block_size, sliding_window, max_num_seqs, max_model_len, max_num_batched_tokens,
                           float(logits_soft_cap))


CACHE_WRITE = "_C_cache_ops::reshape_and_cache_flash"  # the one vLLM C op on this path (do_kv_cache_update)


def prepare() -> dict:
    """The import shims of exercise/fake_ops.py and its stand-in for vLLM's cache write (only where vLLM's C
    extension lacks it), before vLLM's backend is imported. The MoE stand-ins are left out: a process that later
    loads vLLM's own MoE extension must not find its ops already defined."""
    from . import fake_ops

    return {"imports": fake_ops.install_import_shims(), "ops": fake_ops.install_ops(only=(CACHE_WRITE,))}


@contextlib.contextmanager
def target_queries(cuda: str):
    """Cross mode: the CUDA queries FlashInfer and vLLM make directly answer the target's: the capability
    (``torch.cuda.get_device_capability``), the device properties (FlashInfer's ``get_compute_capability`` and
    ``get_device_sm_count``) and ``torch.version.cuda`` (FlashInfer's ``is_sm90a_supported``). Yields what was
    faked."""
    if not cross():
        yield []
        return
    import types

    import torch
    import triton

    target = triton.runtime.driver.active.get_current_target()
    sm_count = triton.runtime.driver.active.utils.get_device_properties(0)["multiprocessor_count"]
    major, minor = target.arch // 10, target.arch % 10
    properties = types.SimpleNamespace(major=major, minor=minor, multi_processor_count=sm_count,
                                       name="kernelcache fake target", total_memory=80 << 30)
    saved = (torch.cuda.get_device_capability, torch.cuda.get_device_properties, torch.version.cuda, torch.cuda.device)
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_properties = lambda device=None: properties
    torch.version.cuda = cuda
    torch.cuda.device = lambda device=None: contextlib.nullcontext()
    _clear_flashinfer_caches()
    try:
        yield [{"call": "torch.cuda.get_device_capability", "returns": [major, minor]},
               {"call": "torch.cuda.get_device_properties", "returns": {"major": major, "minor": minor,
                                                                        "multi_processor_count": sm_count}},
               {"call": "torch.version.cuda", "returns": cuda},
               {"call": "torch.cuda.device", "returns": "a context that selects nothing"}]
    finally:
        (torch.cuda.get_device_capability, torch.cuda.get_device_properties, torch.version.cuda,
         torch.cuda.device) = saved
        _clear_flashinfer_caches()


def host_tensors():
    """Cross mode: host-side tensors stay real CPU tensors, and so do results computed from real CPU tensors alone
    (the builder and FlashInfer's ``plan()`` read them through ``.numpy()``, ``.item()`` and boolean masks);
    exercise/fake_runner_ops.py ``HostTensors`` makes the factories'."""
    if not cross():
        return contextlib.nullcontext()
    from .fake_runner_ops import HostTensors

    class RealHost(HostTensors):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            import torch

            if func not in (torch.Tensor.pin_memory, torch.Tensor.is_pinned) and _real_cpu_only(args, kwargs or {}):
                with torch.utils._python_dispatch._disable_current_modes():
                    return func(*args, **(kwargs or {}))
            return super().__torch_function__(func, types, args, kwargs)

    return RealHost()


def _real_cpu_only(args: tuple, kwargs: dict) -> bool:
    """Whether a call's tensors are all real CPU tensors (at least one), and it names no CUDA device."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    tensors, stack = [], [*args, *kwargs.values()]
    while stack:
        value = stack.pop()
        if isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, (torch.device, str)) and str(value).startswith("cuda"):
            return False
    return bool(tensors) and all(not isinstance(t, FakeTensor) and t.device.type == "cpu" for t in tensors)


def _clear_flashinfer_caches() -> None:
    """FlashInfer memoises what it asked the device (``functools.cache``): forget it with the fakes."""
    from flashinfer import utils

    for name in ("get_device_properties", "get_compute_capability"):
        cached = getattr(utils, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


@contextlib.contextmanager
def artifactory(reachable: bool):
    """vLLM's ``has_nvidia_artifactory`` answers ``reachable`` (instead of asking the network)."""
    from vllm.utils import flashinfer as vllm_flashinfer

    saved = vllm_flashinfer.has_nvidia_artifactory
    vllm_flashinfer.has_nvidia_artifactory = lambda: reachable
    vllm_flashinfer.supports_trtllm_attention.cache_clear()
    try:
        yield
    finally:
        vllm_flashinfer.has_nvidia_artifactory = saved
        vllm_flashinfer.supports_trtllm_attention.cache_clear()


def make_state(shape: FlashInferShape, recorder: Recorder) -> FlashInferState:
    """The layer, its KV cache, the metadata builder and the runner's buffers, on ``cuda``."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.flashinfer import FlashInferBackend

    config = triton_attention.server_config(shape)
    extra = {"logits_soft_cap": shape.logits_soft_cap} if shape.logits_soft_cap else {}
    with set_current_vllm_config(config):
        layer = triton_attention.make_layer(shape, config, FlashInferBackend, **extra)
        spec = layer.get_kv_cache_spec(config)
        width = triton_attention.block_table_width(shape)
        num_blocks = shape.max_num_seqs * width + 1
        with torch.device("cuda"):
            kv_cache = triton_attention.make_kv_cache(config, spec, num_blocks, FlashInferBackend)
            layer.kv_cache = kv_cache
            builder = FlashInferBackend.get_builder_cls()(spec, [LAYER_NAME], config, torch.device("cuda"))
            seqs, tokens = shape.max_num_seqs, shape.max_num_batched_tokens
            return FlashInferState(shape, config, layer, builder, kv_cache,
                                   torch.zeros((seqs, width), dtype=torch.int32),
                                   torch.zeros(seqs + 1, dtype=torch.int32), torch.zeros(seqs, dtype=torch.int32),
                                   torch.zeros(tokens, dtype=torch.int64), num_blocks, recorder)


def step(state: FlashInferState, batch: Batch, tensors: tuple[Any, Any, Any] | None = None) -> Any:
    """The builder on the step's metadata (``plan()``), then ``Attention.forward`` (``run()``)."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    common = triton_attention.fill(state, batch)
    with set_current_vllm_config(state.config):
        build = state.builder.build_for_cudagraph_capture if batch.capture else partial(state.builder.build, 0)
        metadata = build(common)
        q, k, v = tensors if tensors is not None else triton_attention.qkv(state, batch.num_tokens)
        slots = {LAYER_NAME: state.slot_mapping[: batch.num_tokens]}
        with set_forward_context({LAYER_NAME: metadata}, state.config, slot_mapping=slots):
            return state.layer.forward(q, k, v)


def run(state: FlashInferState, kind: str, batch: Batch) -> None:
    step(state, batch)
    state.calls[kind] = state.calls.get(kind, 0) + 1


def sweeps(state: FlashInferState) -> list[tuple[str, list[Batch]]]:
    """The batch kinds a server runs: CUDA-graph capture of uniform decodes, decodes (short and long contexts),
    prefills (with and without a cached prefix) and mixed prefill + decode batches."""
    shape = state.shape
    context = partial(triton_attention.context, shape=shape)
    sizes = sorted({s for s in state.config.compilation_config.cudagraph_capture_sizes or []
                    if s <= shape.max_num_seqs})
    capture = [Batch((1,) * s, tuple(context(i, 1) for i in range(s)), capture=True) for s in sizes[:1] + sizes[-1:]]
    decodes = [Batch((1,) * b, tuple(context(i, 1) for i in range(b))) for b in (1, min(7, shape.max_num_seqs))]
    prompt = min(shape.max_num_batched_tokens, shape.max_model_len, 512)
    prefill = [Batch((prompt,), (prompt,)), Batch((prompt,), (min(shape.max_model_len, 2 * prompt),))]
    mixed = [Batch((prompt - 3,) + (1,) * 3, (prompt - 3,) + tuple(context(i, 1) for i in range(1, 4)))]
    return [("capture", capture), ("decode", decodes), ("prefill", prefill), ("mixed", mixed)]


def describe_decode(builder: Any) -> str:
    """Which decode kernel vLLM's builder chose: XQA, trtllm-gen, or FlashInfer's own."""
    kernel = getattr(builder, "flashinfer_trtllm_api_decode_kernel", None)
    return kernel.value if kernel is not None else "flashinfer-native"


def jit_built(recorder: Recorder) -> dict:
    """Native mode: URI -> the library FlashInfer's JIT built for each recorded nvcc module."""
    return {n: {"library": str(recorder.live[n].jit_library_path), "seconds": None} for n in recorder.buildable()
            if recorder.live[n].jit_library_path.is_file()}


def build_specs(recorder: Recorder) -> dict:
    """Build each recorded nvcc module with FlashInfer's own ``JitSpec.build`` (nvcc + ninja): URI -> its library,
    the seconds it took and the sources it was built from (``built_from``)."""
    built = {}
    for name in recorder.buildable():
        spec = recorder.live[name]
        started = time.perf_counter()
        with users_cc():
            spec.build(verbose=True, need_lock=True)  # FlashInfer's lock: builds may share the workspace
        seconds = round(time.perf_counter() - started, 1)
        sources = built_from(spec, recorder.specs[name])
        built[name] = {"library": str(spec.jit_library_path), "seconds": seconds, "sources": list(sources),
                       "sources_sha256": sources_digest(sources, _package_root().parent)}
    return built


@contextlib.contextmanager
def users_cc():
    """``CC`` as the user set it (``CC_VARIABLE``) while FlashInfer builds, where the build says what it was."""
    if CC_VARIABLE not in os.environ:
        yield
        return
    saved = os.environ.get("CC")
    os.environ.pop("CC", None)
    if os.environ[CC_VARIABLE]:
        os.environ["CC"] = os.environ[CC_VARIABLE]
    try:
        yield
    finally:
        os.environ.pop("CC", None)
        if saved is not None:
            os.environ["CC"] = saved


OWN_SOURCES = ("data/csrc", "data/include")  # FlashInfer's own code in its package (not its vendored libraries)


def built_from(spec: Any, record: SpecRecord) -> tuple[str, ...]:
    """The module's sources in the flashinfer package and every header of FlashInfer's own its objects included,
    as ninja recorded them (``ninja -t deps``), relative to the package's parent, sorted."""
    import shutil
    import subprocess

    package = _package_root()
    own = tuple(package / part for part in OWN_SOURCES)
    ninja = shutil.which("ninja") or "ninja"
    done = subprocess.run([ninja, "-t", "deps"], cwd=spec.build_dir, capture_output=True, text=True, check=True)
    found = set(record.sources)
    for line in done.stdout.splitlines():
        path = Path(line.strip())
        if line.startswith((" ", "\t")) and any(root in path.parents for root in own):
            found.add(_relative(path, package))
    return tuple(sorted(found))
