"""Installs checked here before: a no-op ``install`` of the same bundle file, answered from one small record.

A no-op install otherwise reads the bundle's manifest (zstd, then a few hundred dataclasses), asks the GPUs
(a child process that initialises CUDA) and compares fingerprints: 150-300 ms on every pod start. An install
that accepted a bundle with no difference at all keeps ``<cache>/.kernelcache/checked/<hash of the bundle's
real path>.json`` with what that decision rested on:

* the bundle file's identity: device, inode, size, mtime_ns and ctime_ns (a rewrite, a copy or a rename
  over it changes at least the ctime, which cannot be set back);
* the bundle's digest, and every file it installed;
* the digest of the ``EnvironmentKey`` the fingerprint was checked under (format/envkey.py: the interpreter,
  Triton's files, ptxas, the key variables, the packages' metadata, all by stat);
* the GPU witness it was checked with (format/envscan.py ``gpu_witness``), or none when no GPU check ran;
* the warnings it gave (differences that do not block, such as another torch, or autotune choices it left out)
  and whether it installed the bundle's autotune choices: a no-op answered from the record says them again;
* the signature file beside the bundle (``B.tar.zst.sig``) by the same identity as the bundle's (or that there was
  none), what its check found (bundle/signature.py ``SignatureInfo``) and the fingerprints of the trusted keys it
  was checked with. A no-op answers only when the same keys are given now (read as fingerprints, with the
  standard library: bundle/trust.py) and, under a policy that requires a signature, the record's check found one
  by a trusted key; an install accepted without those keys, or without a signature, is checked again in full;
* kernelcache's version and this record's format.

``find_checked`` answers the digest only when every one of these holds now, the receipt is there, every
installed file is there and no install is half-published; anything else answers None and the caller takes
the full path, which checks everything again (a record that answers gets its mtime set to now: ``prune`` removes
records unused for long). The record is never the only guard of a refusal: it exists
only for a bundle that was accepted, under exactly the state that is compared. Reading it takes the standard
library's os and the C halves of json and hashlib (``_json``, ``_sha2``: hooks/kernelcache_records.py) and nothing
heavier: no dataclasses, pathlib or subprocess (each costs a pod start 15-40 ms of imports on 2 cores), nor
collections, contextlib, functools, importlib or kernelcache's errors (1-5 ms each), so the entry point answers a
no-op install before click or the installer load (tests/test_noop_install.py watches which modules it imports).
"""

from __future__ import annotations

import os

from ..bundle.trust import NO_POLICY, key_fingerprints, signature_path
from ..format.envscan import gpu_witness, key_digest, scan_key
from ..hooks.kernelcache_records import SAME_FILE, json_loads, sha256_hex, stamp
from ..version import __version__
from .layout import CHECKED, INSTALLED, STATE_DIR, keep_newest, state_path, unfinished

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .state import CacheDir

FORMAT = 1
KEEP = 16


def bundle_identity(path: str | os.PathLike) -> list[int] | None:
    """(device, inode, size, mtime_ns, ctime_ns) of a regular file; None for anything else."""
    found = stamp(path, SAME_FILE)
    return found if found is not None and os.path.isfile(path) else None


def _record_path(root: str, bundle: str) -> str:
    name = sha256_hex(os.path.realpath(bundle).encode())[:32]
    return state_path(root, CHECKED, f"{name}.json")


class Checked:
    """A no-op install the record vouches for. A plain class: a namedtuple, typing's NamedTuple or a dataclass
    would cost every pod start the import of collections, typing or dataclasses."""

    __slots__ = ("cache_dir", "digest", "warnings", "signature", "choices")

    def __init__(self, cache_dir: str, digest: str, warnings: tuple[str, ...], signature: dict, choices: str) -> None:
        self.cache_dir, self.digest, self.warnings, self.signature, self.choices = (
            cache_dir, digest, warnings, signature, choices)


def remember_checked(cache: CacheDir, bundle: str | os.PathLike, identity: list[int], digest: str,
                     files: list[str], environment_key_digest: str, gpu: str | None, warnings: list[str],
                     signed: tuple[list[int] | None, dict | None] = (None, None), choices: str = "",
                     fits: dict | None = None) -> None:
    """Keep what an accepted install was checked against (``identity``: the bundle file's, taken before it was
    read; ``signed``: its signature file's identity, taken before it was read, and what its check found; ``fits``:
    the ``--arch`` values and ``--gpu`` profiles that take the bundle, remote/__init__.py ``fits``). A cache
    dir that cannot take it only loses the speed-up."""
    if not cache.state.is_dir() or bundle_identity(bundle) != identity:
        return  # the file changed while it was installed: nothing to vouch for
    if bundle_identity(signature_path(bundle)) != signed[0]:
        return  # so did its signature
    record = {"format": FORMAT, "kernelcache": __version__, "bundle": os.path.realpath(bundle),
              "identity": identity, "digest": digest, "environment_key": environment_key_digest, "gpu": gpu,
              "warnings": list(warnings), "files": sorted(files), "signature_file": signed[0],
              "signature": signed[1], "choices": choices, "fits": fits or {}}
    import contextlib
    import json
    from pathlib import Path

    from .publish import atomic_write  # the writer is the installer, which has these imported already

    path = Path(_record_path(os.fspath(cache.root), os.fspath(bundle)))
    with contextlib.suppress(OSError):
        path.parent.mkdir(exist_ok=True)
        atomic_write(path, json.dumps(record).encode())
        keep_newest(str(path.parent), KEEP)


def find_checked(bundle: str | os.PathLike, root: str | os.PathLike, check_gpu: bool = True,
                 policy=NO_POLICY, arch: str | None = None, gpu: str | None = None) -> Checked | None:
    """The no-op answer when ``bundle`` is installed in the cache dir ``root`` (as resolved once: ``cache_root``,
    ``CacheDir.root``) and was accepted under the state and the signature ``policy`` (bundle/trust.py) that hold
    now, and ``--arch`` / ``--gpu`` take it; None whenever the full install path must decide (which also says why
    an arch or a profile is refused). Each command's front door asks it once, before it loads the installer
    (install.py ``install``, runtime/env.py ``install_checked``, entry.py's plain forms); ``install_into`` itself
    never asks."""
    if "://" in os.fspath(bundle):
        return None
    root = os.fspath(root)
    try:
        with open(_record_path(root, os.fspath(bundle)), "rb") as handle:
            record = json_loads(handle.read().decode())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not _fits(record, arch, gpu) or not _holds(record, root, bundle, check_gpu) \
            or not _signature_holds(record, bundle, policy):
        return None
    # Nothing is written here: a no-op install leaves the cache dir as it was (prune ages a record from its check).
    return Checked(root, record["digest"], tuple(record["warnings"]), record["signature"],
                   str(record.get("choices") or ""))


def _fits(record: dict, arch: str | None, gpu: str | None) -> bool:
    """Whether the record says ``--arch`` / ``--gpu`` (as given) take its bundle."""
    fits = record.get("fits")
    if arch is None and gpu is None:
        return True
    if not isinstance(fits, dict):
        return False
    return (arch is None or arch.strip().lower() in (fits.get("archs") or ())) and (
        gpu is None or gpu.lower() in (fits.get("gpus") or ()))


def _holds(record: dict, root: str, bundle: str | os.PathLike, check_gpu: bool) -> bool:
    digest, files, warnings = record.get("digest"), record.get("files"), record.get("warnings")
    if (record.get("format") != FORMAT or record.get("kernelcache") != __version__
            or record.get("bundle") != os.path.realpath(bundle) or record.get("identity") != bundle_identity(bundle)
            or not isinstance(digest, str) or not isinstance(files, list) or not isinstance(warnings, list)
            or not all(isinstance(w, str) for w in warnings)):
        return False
    state = os.path.join(root, STATE_DIR)
    if not os.path.isfile(os.path.join(state, INSTALLED, f"{digest}.json")) or unfinished(state):
        return False
    if not all(isinstance(f, str) and os.path.exists(os.path.join(root, f)) for f in files):
        return False
    if check_gpu and record.get("gpu") != gpu_witness():
        return False
    return record.get("environment_key") == key_digest(scan_key())


def _signature_holds(record: dict, bundle: str | os.PathLike, policy) -> bool:
    """The same signature file as the record's (or none, as then), checked with the same trusted keys as now, and
    found signed by one of them where a signature is required."""
    found = record.get("signature")
    if record.get("signature_file") != bundle_identity(signature_path(bundle)) or not isinstance(found, dict):
        return False
    keys = key_fingerprints(policy.keys) if policy.keys else ()
    if keys is None or list(keys) != found.get("trusted_keys"):
        return False
    return not policy.require or found.get("status") == "trusted"


# -- for cache management (kernelcache prune) -------------------------------------------------------


def record_holds(path: str) -> bool:
    """Whether the record at ``path`` could answer again: it reads, is of this format and kernelcache version, and
    its bundle file is still the one it checked (the identity holds a ctime, which never goes back)."""
    try:
        with open(path, "rb") as handle:
            record = json_loads(handle.read().decode())
    except (OSError, ValueError):
        return False
    return (isinstance(record, dict) and record.get("format") == FORMAT and record.get("kernelcache") == __version__
            and isinstance(record.get("bundle"), str) and record.get("identity") == bundle_identity(record["bundle"]))
