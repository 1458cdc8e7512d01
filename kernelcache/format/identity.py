"""The build's Triton known by content, so an install can fingerprint an identical Triton without importing it.

A first fingerprint (``fingerprint.local_environment``) imports Triton (~0.15 s) and hashes its 400 MB
``libtriton.so`` for ``triton_key()`` (~0.35-0.5 s): most of a pod's cold install. ``triton_key()``
(https://github.com/triton-lang/triton/blob/main/python/triton/runtime/cache.py) is a function of the
contents of the files it reads and nothing else, so a bundle that records each of those files' content
identity (hooks/kernelcache_tritonkey.py: sources by sha256, shared libraries by size and GNU build
ID) lets an install decide, from a few ms of hashing, that its Triton's key is the bundle's. The rest of the
fingerprint follows from the record too:

* the ptxas text: the build names the binary Triton ran for each arch, relative to Triton's directory
  (``backends/nvidia/bin/ptxas``, ``ptxas-blackwell`` from sm_100: ``get_ptxas`` in
  triton/backends/nvidia/compiler.py); here it is run the way Triton runs it (``ptxas --version``), unless a
  ``TRITON_PTXAS*`` or ``TRITON_MOCK_PTX_VERSION`` variable would make Triton pick another binary or text;
* the cache-invalidating variables: libtriton.so holds their list (``get_cache_invalidating_env_vars``), the
  same list where the files are the same. The build records which candidate variables (``key_candidates``:
  every name Triton could read into a key) its processes had; their fingerprint says which of those are in
  the list. A candidate set here that the build did not have is a name whose membership is unknown: then the
  fingerprint is computed as before.

Whatever cannot be decided this way (no record, another file, another variable, a ptxas that does not run)
returns None and the caller computes the fingerprint by importing Triton, as before: never a guess.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

from ..hooks.kernelcache_tritonkey import identity, triton_files
from .envscan import OPTION_ENV_VARS, key_candidates
from .fingerprint import platform_tag, python_tag
from .manifest import Environment, TritonIdentity, arch_to_capability

# Variables that make Triton run another ptxas, or none, for its --version text (triton/knobs.py).
PTXAS_VARIABLES = ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_MOCK_PTX_VERSION")


def identity_here(archs: list[str]) -> TritonIdentity | None:
    """This process's Triton, by content, for the given archs (imports Triton; the build side).
    None when some file has no cheap identity or a ptxas lies outside Triton's directory."""
    from ..hooks.kernelcache_tritonkey import triton_root

    try:
        import triton.runtime.cache as cache
        from triton.backends.nvidia.compiler import get_ptxas

        root = triton_root(cache)
        ptxas = {arch: os.path.relpath(os.path.realpath(get_ptxas(arch_to_capability(arch)).path), root)
                 for arch in archs}
        key = cache.triton_key()
    except Exception:  # noqa: BLE001 -- another Triton layout (3.4/3.5 ptxas API, no nvidia backend): no record
        return None
    files = {rel: identity(os.path.join(root, rel)) for rel in triton_files(root)}
    if None in files.values() or any(p.startswith("..") for p in ptxas.values()):
        return None
    return TritonIdentity(files, key, tuple(sorted(key_candidates(dict(os.environ)))), ptxas)  # type: ignore[arg-type]


def environment_from(record: TritonIdentity, built: Environment, archs: list[str], root: str | None,
                     versions) -> Environment | None:
    """This environment's fingerprint, when its Triton at ``root`` is the recorded one (else None).

    ``built``: the bundle's fingerprint (which candidate variables are cache-invalidating);
    ``versions``: name -> installed version (``fingerprint.package_version``)."""
    here = key_candidates(dict(os.environ))
    if root is None or not set(archs) <= set(record.ptxas) or any(v in here for v in PTXAS_VARIABLES):
        return None
    if not set(here) <= set(record.variables) | set(OPTION_ENV_VARS) or not _same_files(record, root):
        return None
    ptxas = {arch: _ptxas_version(os.path.join(root, record.ptxas[arch])) for arch in sorted(set(archs))}
    if None in ptxas.values():
        return None
    return Environment(
        python=python_tag(),
        platform=platform_tag(),
        triton=versions("triton"),
        triton_key_sha256=hashlib.sha256(record.triton_key.encode()).hexdigest(),
        ptxas=ptxas,  # type: ignore[arg-type]
        env_vars={k: v for k, v in here.items() if k in built.env_vars or k in OPTION_ENV_VARS},
        torch=versions("torch"),
        vllm=versions("vllm"),
        flashinfer=versions("flashinfer-python"),
    )


def _same_files(record: TritonIdentity, root: str) -> bool:
    """The same files as the record's (no more, no fewer), each with the recorded identity."""
    if set(triton_files(root)) != set(record.files):
        return False
    return all(identity(os.path.join(root, rel)) == want for rel, want in record.files.items())


def _ptxas_version(path: str) -> str | None:
    """``ptxas --version`` as Triton reads it (get_ptxas_version: check_output, decoded), or None."""
    try:
        return subprocess.check_output([path, "--version"], stderr=subprocess.DEVNULL, timeout=60).decode("utf-8")
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return None
