"""torch's CUDA side answered for a named GPU that is not here, so that ``torch.compile`` (Dynamo, then Inductor's
Triton code generation, then Triton) compiles a CUDA graph on a CPU-only machine.

``fake_target`` makes Triton compile for the target; ``fake_device`` makes FakeTensors on ``cuda``. A compile of
a model also goes through torch's CUDA runtime, which a machine without a driver refuses (``cudaErrorInsufficient
Driver``, or ``Found no NVIDIA driver``). Where each step asks for the device (torch 2.11 and 2.14):

* C++: ``Tensor.__getitem__`` on a FakeTensor of ``cuda`` (``THPVariable_getitem`` takes an ``OptionalDeviceGuard``:
  ``cudaGetDevice``/``cudaSetDevice``), and autograd's ``InputMetadata`` (``getCurrentCUDAStream``, whose first call
  runs ``initGlobalStreamState``: ``cudaGetDeviceCount``, ``cudaDeviceGetStreamPriorityRange``). No Python hook
  reaches these; ``build_cudart_shim`` builds a library that answers those runtime calls for one device 0, to be
  preloaded (``LD_PRELOAD``) in the compiling process. Nothing else of the runtime is replaced.
* C++, through the driver: torch 2.11's ``c10::cuda::MaybeSetDevice`` asks ``cuDevicePrimaryCtxGetState`` (dlsym on
  ``libcuda.so.1``, the fake target's stub): ``DRIVER_DEFINITIONS`` defines it (no context yet) in that stub.
* Python: Dynamo saves the CUDA RNG state around a trace (``convert_frame.preserve_global_state``) and asks
  ``torch.cuda.is_current_stream_capturing``; Inductor enters ``torch.cuda.device`` and the device interface's
  ``DeviceGuard``, reads ``get_device_properties`` (heuristics, and the product name ``CacheBase.get_system`` hashes),
  and its static launcher loads every cubin into the device (``StaticallyLaunchedCudaKernel.load_kernel``) to read its
  registers; nothing of that load is saved. ``install`` answers these for the product.
* Dynamo registers ``torch.accelerator.current_stream()`` when an accelerator is available
  (``SymbolicStreamState``); a CUDA stream cannot be made without a driver, so here no accelerator is available, as
  on any CPU-only host (the cross-precompile case torch's aot_compile documents).
* torch 2.11's FakeTensor makes a real tensor on the device before its first fake one (``init_gpu_context``).
* Inductor traces its replacement patterns from example tensors, some made by ``torch.tensor(data, device="cuda")``,
  whose C++ path copies host data to the device: ``FakeCuda`` routes it inside the pattern matcher's FakeTensorMode.

What needs the device and is left out: ``standalone_compile`` (vLLM's ``InductorStandaloneAdaptor``) turns on
``triton.autotune_at_compile_time``, and the wrapper then runs a block that allocates example inputs and launches
every kernel, benchmarking those with several configs (``PythonWrapperCodegen.generate_and_run_autotune_block``).
``skip_compile_time_autotune`` skips it and keeps the block: those kernels keep all their configs and benchmark at
their first launch on the GPU (no compile).

Also needing the device, and deciding the generated code: vLLM turns on Inductor's ``combo_kernels`` and
``benchmark_combo_kernel`` for CUDA (``CompilationConfig.__post_init__``), and Inductor's scheduler then times each
candidate group of kernels against its combined kernel on the GPU to decide whether to combine them
(``Scheduler.speedup_by_combo_kernel`` -> ``benchmark_fused_nodes`` -> ``rand_strided`` inputs on the device).
``combine_without_benchmark`` answers as Inductor does with ``benchmark_combo_kernel`` off (combine) and records each
group; where the GPU's timing would have said otherwise, the generated code differs (not the key or the config).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections import namedtuple
from pathlib import Path

SHIM_CALLS = """\
int cudaGetDevice(int *device) { *device = 0; return 0; }
int cudaSetDevice(int device) { return device == 0 ? 0 : 101; }
int cudaGetDeviceCount(int *count) { *count = 1; return 0; }
int cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return 0;
}
int cudaStreamIsCapturing(void *stream, int *status) { *status = 0; return 0; }
int cudaGetLastError(void) { return 0; }
int cudaPeekAtLastError(void) { return 0; }
"""
SHIM_SYMBOLS = ("cudaGetDevice", "cudaSetDevice", "cudaGetDeviceCount", "cudaDeviceGetStreamPriorityRange",
                "cudaStreamIsCapturing", "cudaGetLastError", "cudaPeekAtLastError")
SHIM_NAME = "libkernelcache_cudart.so"
# Driver entry points torch reaches through its lazy driver table (ATen's LazyNVRTC, dlsym on libcuda.so.1) that must
# answer rather than fail: c10::cuda::MaybeSetDevice asks whether the device has a primary context (torch 2.11).
DRIVER_DEFINITIONS = {
    "cuDevicePrimaryCtxGetState": "int cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active) "
                                  "{ *flags = 0; *active = 0; return 0; }",
}
SKIPPED_AUTOTUNE_BLOCKS: list[str] = []
COMBO_DECISIONS: list[list[str]] = []

Props = namedtuple("Props", "name major minor total_memory multi_processor_count warp_size "
                   "max_threads_per_multi_processor regs_per_multiprocessor shared_memory_per_block_optin "
                   "shared_memory_per_multiprocessor L2_cache_size gcnArchName uuid is_integrated "
                   "max_threads_per_block clock_rate memory_clock_rate memory_bus_width")


def cudart_soname() -> str:
    """The soname of the CUDA runtime torch links (``libcudart.so.<major>``), from ``torch.version.cuda``; its
    symbols carry that version, so the shim's must too."""
    import torch

    if not torch.version.cuda:
        raise RuntimeError("torch is a CPU-only build: Inductor cannot generate CUDA code with it")
    return f"libcudart.so.{torch.version.cuda.split('.')[0]}"


def build_cudart_shim(directory: str | Path, soname: str | None = None) -> Path:
    """Build the preload library (module docstring) into ``directory``; returns its path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    soname = soname or cudart_soname()
    source, script, target = out / "shim.c", out / "shim.map", out / SHIM_NAME
    source.write_text(SHIM_CALLS)
    script.write_text(f"{soname} {{ global: {'; '.join(SHIM_SYMBOLS)}; local: *; }};\n")
    cc = os.environ.get("CC") or "gcc"
    subprocess.run([cc, "-shared", "-fPIC", f"-Wl,--version-script={script}", "-o", str(target), str(source)],
                   check=True, stdout=subprocess.DEVNULL)
    return target


def shim_preloaded() -> bool:
    return SHIM_NAME in os.environ.get("LD_PRELOAD", "")


def install(capability: int, sm_count: int, product: str, total_memory: int) -> None:
    """Answer torch's CUDA queries for ``product`` (``sm_<capability>``, ``sm_count`` SMs) in this process."""
    import torch

    props = Props(product, capability // 10, capability % 10, total_memory, sm_count, 32, 2048, 65536, 232448,
                  233472, 52428800, "", "kernelcache-fake", 0, 1024, 1980000, 2619000, 5120)
    _answer_torch_cuda(torch, props)
    _no_gpu_context()
    _answer_device_interface(props)
    _no_accelerator(torch)
    _patterns_through_fake_cuda()
    _no_cubin_load()


def _answer_torch_cuda(torch, props: Props) -> None:
    import torch.cuda.graphs as cuda_graphs
    import torch.cuda.memory as cuda_memory
    import torch.cuda.random as cuda_random

    cap = (props.major, props.minor)
    for name, value in (("is_available", lambda: True), ("device_count", lambda: 1), ("current_device", lambda: 0),
                        ("get_device_properties", lambda device=None: props),
                        ("get_device_capability", lambda device=None: cap),
                        ("get_device_name", lambda device=None: props.name), ("set_device", lambda device: None),
                        ("synchronize", lambda device=None: None), ("is_initialized", lambda: True),
                        ("_lazy_init", lambda: None), ("_exchange_device", lambda device: 0),
                        ("_maybe_exchange_device", lambda device: 0),
                        ("is_current_stream_capturing", lambda: False)):
        setattr(torch.cuda, name, value)
    cuda_graphs.is_current_stream_capturing = lambda: False
    state = torch.zeros(16, dtype=torch.uint8)
    for module in (torch.cuda, cuda_random):
        module.get_rng_state = lambda device="cuda": state.clone()
        module.set_rng_state = lambda new_state, device="cuda": None
        module.get_rng_state_all = lambda: [state.clone()]
        module.set_rng_state_all = lambda states: None
        module.manual_seed = lambda seed: None
        module.manual_seed_all = lambda seed: None
        module.current_device = lambda: 0
    cuda_memory.mem_get_info = lambda device=None: (props.total_memory, props.total_memory)
    torch.cuda.mem_get_info = cuda_memory.mem_get_info


def _no_gpu_context() -> None:
    """torch 2.11's FakeTensor makes one real tensor on a GPU device before its first fake one there
    (``fake_tensor.init_gpu_context``, for backward); nothing here runs backward."""
    import torch._subclasses.fake_tensor as fake_tensor

    if hasattr(fake_tensor, "init_gpu_context"):
        fake_tensor.init_gpu_context = lambda device: None


def _answer_device_interface(props: Props) -> None:
    from torch._dynamo.device_interface import CudaInterface

    for name, value in (("exchange_device", lambda device: 0), ("maybe_exchange_device", lambda device: 0),
                        ("current_device", lambda: 0), ("set_device", lambda device: None),
                        ("device_count", lambda: 1), ("synchronize", lambda device=None: None),
                        ("get_device_properties", lambda device=None: props),
                        ("get_raw_stream", lambda device=None: 0), ("memory_allocated", lambda device=None: 0),
                        ("is_bf16_supported", lambda including_emulation=True: True)):
        setattr(CudaInterface, name, staticmethod(value))


def _no_accelerator(torch) -> None:
    torch.accelerator.is_available = lambda: False
    torch.accelerator.current_device_index = lambda: 0


def _patterns_through_fake_cuda() -> None:
    import torch._inductor.pattern_matcher as pattern_matcher
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .fake_device import FakeCuda

    @contextlib.contextmanager
    def fake_mode_with_routing(*args, **kwargs):
        with FakeTensorMode(*args, **kwargs) as mode, FakeCuda():
            yield mode

    pattern_matcher.FakeTensorMode = fake_mode_with_routing


def _no_cubin_load() -> None:
    """``load_kernel`` without the device: handles that launch nothing; registers and spills unknown (0), so
    Inductor's ``dynamic_scale_rblock`` adds no smaller-RBLOCK config where the GPU, counting registers, might."""
    from torch._inductor.runtime import static_triton_launcher

    def load_kernel(self, device):
        if getattr(self, "device_agnostic", False):  # torch 2.14; 2.11 has one module per kernel
            self.modules[device], self.functions[device] = 1, 1
            self.n_regs, self.n_spills = 0, 0
            return
        if self.function is not None:
            return
        self.module, self.function, self.n_regs, self.n_spills = 1, 1, 0, 0
        self.cubin_path = None
        self.cubin_raw = None

    static_triton_launcher.StaticallyLaunchedCudaKernel.load_kernel = load_kernel


def skip_compile_time_autotune() -> None:
    """See the module docstring; the skipped blocks are kept in ``SKIPPED_AUTOTUNE_BLOCKS``."""
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    def skip(self) -> None:
        SKIPPED_AUTOTUNE_BLOCKS.append(self.kernel_autotune_defs.getvalue() + "\n"
                                       + self.kernel_autotune_calls.getvalue())

    PythonWrapperCodegen.generate_and_run_autotune_block = skip


def driver_symbols_of(package_dir: str | Path) -> tuple[str, ...]:
    """The CUDA driver entry points (``cu*``) the shared objects directly in ``package_dir`` leave undefined, read
    with ``nm -D`` (binutils): vLLM's compiled extensions resolve them from ``libcuda.so.1`` when imported, so the
    fake target's stub must define them too (``vllm/platforms/cuda.py`` imports ``vllm._C_stable_libtorch``)."""
    names: set[str] = set()
    for library in sorted(Path(package_dir).glob("*.so")):
        listed = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True)
        for line in listed.stdout.splitlines():
            name = line.split()[-1].split("@")[0] if line.split() else ""
            if name.startswith("cu") and name[2:3].isupper():
                names.add(name)
    return tuple(sorted(names))


def combine_without_benchmark() -> None:
    """See the module docstring; each group decided is kept in ``COMBO_DECISIONS`` (its nodes' names)."""
    from torch._inductor.scheduler import Scheduler

    def combine(self, nodes) -> bool:
        COMBO_DECISIONS.append([node.get_name() for node in nodes])
        return True

    Scheduler.speedup_by_combo_kernel = combine
