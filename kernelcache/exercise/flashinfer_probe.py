"""Ask FlashInfer itself, in a fresh interpreter, for an installed module: found, loaded, called.

``python -m kernelcache.exercise.flashinfer_probe NAME [--libcudart PATH] [--call]`` runs in the
environment ``kernelcache env`` gives (providers on PYTHONPATH, ``FLASHINFER_DISABLE_JIT=1``) and
prints one JSON line:

* ``artifacts``: the prebuilt files FlashInfer's own lookup (``JitSpec.aot_artifacts``) resolved;
* ``loaded``: whether FlashInfer loaded the module (with JIT disabled a missing one raises
  ``MissingJITCacheError`` instead of compiling);
* ``called``: with ``--call`` (a GPU is visible), whether one sampling call ran on it.

A name outside ``KNOWN`` is a JIT module's URI (an attention module, exercise/vllm_flashinfer.py): its spec is
FlashInfer's ``JitSpecNvcc`` under that name, and ``build_and_load`` (JIT disabled) resolves and loads it from
the providers exactly as FlashInfer's wrappers do; nothing is called on the GPU for it.

Without a GPU, ``--libcudart`` preloads a CUDA runtime (a CPU-only torch brings none) so the
module's shared library can be loaded; nothing is launched then.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from typing import Any

# Module name -> (the FlashInfer function returning its JitSpec, the function loading the module).
KNOWN = {"sampling": ("flashinfer.jit.sampling:gen_sampling_module", "flashinfer.sampling:get_sampling_module")}


def _attr(target: str) -> Any:
    from importlib import import_module

    module, _, name = target.partition(":")
    return getattr(import_module(module), name)


def _call_sampling() -> None:
    """One top-k sampling call on the visible GPU: the kernels really run."""
    import flashinfer.sampling
    import torch

    probs = torch.softmax(torch.randn(4, 1024, device="cuda"), dim=-1)
    samples = flashinfer.sampling.top_k_sampling_from_probs(probs, 8)
    torch.cuda.synchronize()
    if samples.shape[0] != 4:
        raise RuntimeError(f"top_k_sampling_from_probs returned shape {tuple(samples.shape)}")


def _uri_spec(name: str) -> Any:
    """FlashInfer's nvcc spec for a module known by its URI: no sources, for lookup and load only."""
    from flashinfer.jit.core import JitSpecNvcc

    return JitSpecNvcc(name=name, sources=[], extra_cflags=None, extra_cuda_cflags=None, extra_ldflags=None,
                       extra_include_dirs=None)


def probe(name: str, libcudart: str | None, call: bool) -> dict:
    out: dict = {"name": name, "artifacts": [], "loaded": False, "called": False, "error": None}
    if libcudart:
        ctypes.CDLL(libcudart, mode=ctypes.RTLD_GLOBAL)
    try:
        if name not in KNOWN:
            spec = _uri_spec(name)
            out["artifacts"] = [str(a.path) for a in spec.aot_artifacts]
            spec.build_and_load()
            out["loaded"] = True
            return out
        spec_of, load = KNOWN[name]
        out["artifacts"] = [str(a.path) for a in _attr(spec_of)().aot_artifacts]
        _attr(load)()
        out["loaded"] = True
        if call:
            _call_sampling()
            out["called"] = True
    except Exception as exc:  # noqa: BLE001 -- reported, the caller decides
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kernelcache.exercise.flashinfer_probe")
    parser.add_argument("name")
    parser.add_argument("--libcudart", default=None)
    parser.add_argument("--call", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(probe(args.name, args.libcudart, args.call)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
