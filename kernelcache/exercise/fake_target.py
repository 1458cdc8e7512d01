"""A faithful stand-in for a CUDA GPU that is not here, so Triton compiles for it anyway.

Triton's JIT asks its active driver for the target, the device and the stream, derives the
specialization from the real arguments, and only then compiles; nothing of the driver goes into
the cache key except the target (``JITFunction.run`` in triton/runtime/jit.py keys on
``target = driver.active.get_current_target()``). ``FakeCudaDriver`` answers
those questions for a named arch and turns launches into no-ops. It also builds what Triton 3.6
builds with gcc at first launch -- the per-signature ``__triton_launcher`` and ``cuda_utils`` --
against a stub ``libcuda.so.1``, so the bundle carries them prebuilt.

Use one process per target: Triton memoises the target per JIT function and device.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

from ..usercache import user_cache

# Shared memory per block that CUDA reports (cudaDevAttrMaxSharedMemoryPerBlockOptin), per capability.
MAX_SHARED_MEM = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 103: 232448,
                  110: 232448, 120: 101376, 121: 101376}
_TYPEDEF = re.compile(r"(_t|Handle)$")


class FakeUtils:
    def __init__(self, capability: int, sm_count: int):
        self.props = {
            "max_shared_mem": MAX_SHARED_MEM.get(capability, 101376),
            "max_num_regs": 65536,
            "multiprocessor_count": sm_count,
            "warpSize": 32,
            "sm_clock_rate": 1_980_000,
            "mem_clock_rate": 3_201_000,
            "mem_bus_width": 6144,
        }

    def get_device_properties(self, device: int) -> dict:
        return dict(self.props)

    def load_binary(self, name, kernel, shared, device):
        return ("fake-module", "fake-function", 0, 0, 1024)

    def unload_module(self, module) -> None:
        return None

    def set_printf_fifo_size(self, size: int) -> None:
        return None


def make_driver(capability: int, sm_count: int, prebuild: bool):
    """The driver object for ``triton.runtime.driver.set_active``."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class FakeCudaDriver(DriverBase):
        def __init__(self) -> None:
            self.target = GPUTarget("cuda", capability, 32)
            self.utils = FakeUtils(capability, sm_count)
            self.launcher_cls = _prebuilding_launcher if prebuild else _noop_launcher
            self.prebuild = prebuild

        @classmethod
        def is_active(cls) -> bool:
            return False

        def get_current_target(self):
            return self.target

        def get_current_device(self) -> int:
            return 0

        def set_current_device(self, device: int) -> None:
            pass

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

        def get_device_interface(self):
            import torch

            return torch.cuda

        def map_python_to_cpp_type(self, ty: str) -> str:
            from triton.backends.nvidia.driver import ty_to_cpp

            return ty_to_cpp(ty)

        def get_benchmarker(self):
            raise RuntimeError("kernelcache fake target: no GPU to benchmark on")

    return FakeCudaDriver()


def activate(capability: int, sm_count: int, prebuild: bool = True, stub_dir: str | None = None,
             extra_symbols: tuple[str, ...] = (), definitions: dict[str, str] | None = None):
    """Make Triton compile for ``sm_<capability>`` in this process. Call before any kernel runs.

    ``extra_symbols``: driver entry points the stub defines beyond Triton's (those other libraries loaded in this
    process reference, e.g. vLLM's compiled extensions: exercise/fake_cuda_runtime.py's ``driver_symbols_of``);
    ``definitions``: C definitions of entry points that must succeed rather than fail (by name)."""
    import triton

    if prebuild:
        stub = build_libcuda_stub(stub_dir, extra_symbols, definitions)
        os.environ["TRITON_LIBCUDA_PATH"] = str(stub)
        # Loaded by soname first, so the launchers Triton builds and imports resolve against it.
        ctypes.CDLL(str(stub / "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
    driver = make_driver(capability, sm_count, prebuild)
    triton.runtime.driver.set_active(driver)
    if prebuild:
        build_cuda_utils()
    return driver


def _noop_launcher(src: Any, metadata: Any):
    return lambda *args, **kwargs: None


class LauncherBuildError(RuntimeError):
    """Triton's C launcher or ``cuda_utils`` module could not be built: a bundle would lack it, and the
    GPU would then build it with gcc at first launch. The exercise task fails, and with it the build."""


def _prebuilding_launcher(src: Any, metadata: Any):
    """Build the real launcher .so into the cache (as the GPU would at first launch), launch nothing.

    Only Triton releases with a per-kernel launcher (``make_launcher`` in the NVIDIA driver module, up
    to 3.6) have one to build; from 3.7 every kernel launches through ``cuda_utils``'s generic
    ``launch``, which ``build_cuda_utils`` builds.
    """
    from triton.backends.nvidia import driver as nvidia
    from triton.backends.nvidia.driver import CudaLauncher

    if not hasattr(nvidia, "make_launcher"):
        return _noop_launcher(src, metadata)
    try:
        CudaLauncher(src, metadata)
    except Exception as exc:
        name = getattr(metadata, "name", None) or getattr(getattr(src, "fn", None), "__name__", "?")
        raise LauncherBuildError(f"cannot build Triton's launcher for kernel {name}: {_why(exc)}") from exc
    return _noop_launcher(src, metadata)


def build_cuda_utils() -> None:
    """Build Triton's ``cuda_utils`` module into the cache (the GPU builds it when the driver starts)."""
    from triton.backends.nvidia.driver import CudaUtils

    try:
        CudaUtils()
    except Exception as exc:
        raise LauncherBuildError(f"cannot build Triton's cuda_utils module: {_why(exc)}") from exc


def _why(exc: Exception) -> str:
    compiler = os.environ.get("KERNELCACHE_REAL_CC") or os.environ.get("CC") or "gcc"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())} (C compiler: {compiler})"


def prebuild_launchers(functions) -> int:
    """Build launchers for every kernel compiled so far (compile-only warmups never launch)."""
    count = 0
    for fn in functions:
        for cache in getattr(fn, "device_caches", {}).values():
            for kernel in list(cache[0].values()):
                kernel = kernel.result() if hasattr(kernel, "result") else kernel
                kernel._init_handles()
                count += 1
    return count


def libcuda_symbols() -> list[str]:
    """Every ``cu*`` driver entry point Triton's C helpers reference (read from the installed Triton)."""
    import triton.backends.nvidia as nv

    here = Path(nv.__file__).parent
    text = "".join(p.read_text() for p in (here / "driver.c", here / "driver.py") if p.exists())
    names = set(re.findall(r"\b(cu[A-Z][A-Za-z0-9_]*)\b", text))
    return sorted(n for n in names if not _TYPEDEF.search(n))


def build_libcuda_stub(directory: str | None = None, extra_symbols: tuple[str, ...] = (),
                       definitions: dict[str, str] | None = None) -> Path:
    """A ``libcuda.so.1`` defining the driver symbols (each fails with CUDA_ERROR_UNKNOWN), for linking only.

    Without ``directory``, a per-user one named by the stub's source (``stub_home``): from Triton 3.7 the cache
    key of ``cuda_utils`` hashes the library dirs it links against (``_get_cache_manager`` in
    triton/runtime/build.py), so every build that links against the same dir gives ``cuda_utils`` the same key
    (and the same bundle bytes, and one build-cache entry)."""
    definitions = definitions or {}
    names = sorted((set(libcuda_symbols()) | set(extra_symbols)) - set(definitions))
    source = "".join(f"int {name}(void) {{ return 999; }}\n" for name in names)
    source += "".join(f"{definitions[name]}\n" for name in sorted(definitions))
    out = Path(directory) if directory is not None else stub_home(source)
    target = out / "libcuda.so.1"
    if target.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    unique = f"{os.getpid()}.{uuid.uuid4().hex}"  # builds share the dir: each writes its own files, then renames
    code, tmp = out / f".libcuda_stub.{unique}.c", out / f".libcuda.so.1.{unique}"
    try:
        code.write_text(source)
        cc = os.environ.get("CC") or "gcc"
        subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(code)], check=True,
                       stdout=subprocess.DEVNULL)
        os.replace(tmp, target)
    finally:
        code.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return out


def stub_home(source: str) -> Path:
    """``$XDG_CACHE_HOME/kernelcache/libcuda-stub/<sha256 of the source, 16 digits>`` (``~/.cache/...``)."""
    return user_cache("libcuda-stub", hashlib.sha256(source.encode()).hexdigest()[:16])
