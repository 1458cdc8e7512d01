"""Every error kernelcache raises on purpose, each with its own exit code.

The CLI turns these into one-line messages and exits with ``exit_code``; the Python API raises them.
Codes are part of the interface (docs/FORMAT.md lists them) and never change meaning.
"""

from __future__ import annotations


class KernelcacheError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class UsageError(KernelcacheError):
    """A bad argument combination the option parser could not catch."""

    exit_code = 2


class RecipeError(KernelcacheError):
    """A build recipe (a shipped name or a TOML file) is unknown, malformed or names an unknown key."""

    exit_code = 3


class KeyFileError(UsageError):
    """A key file (``sign --key``, ``--trusted-key``) is not a usable key: unreadable, not PEM, another algorithm."""

    exit_code = 4


class BundleError(KernelcacheError):
    """A bundle file cannot be trusted. Subclasses say why."""

    exit_code = 10


class BundleFormatError(BundleError):
    """Not a readable zstd tar stream: truncated, not zstd, not tar."""

    exit_code = 11


class BundleManifestError(BundleError):
    """manifest.json is missing, not first, not JSON, or of an unknown schema version."""

    exit_code = 12


class UnsafeMemberError(BundleError):
    """A member would escape the cache entry layout: traversal, absolute path, link, device, odd name."""

    exit_code = 13


class IntegrityError(BundleError):
    """A member's bytes differ from the manifest (sha256, size), or members are missing or extra."""

    exit_code = 14


class LimitExceededError(BundleError):
    """The bundle is larger than the configured limits (total size, member size, member count)."""

    exit_code = 15


class EntryError(BundleError):
    """A kernel or module entry is inconsistent: bad key, files outside its dir, a bad group file."""

    exit_code = 16


class UnsignedBundle(BundleError):
    """A signature is required (``--require-signature``) and the bundle has none."""

    exit_code = 17


class UntrustedSignature(BundleError):
    """A signature is required and none verifies with a trusted key: another signer, a tampered or unreadable
    signature."""

    exit_code = 18


class SignatureMismatch(BundleError):
    """A trusted key's signature names another bundle: the bundle (or the registry's signature tag) was swapped."""

    exit_code = 19


class FingerprintMismatch(KernelcacheError):
    """The bundle was built for another environment: its kernels would miss here."""

    exit_code = 20

    def __init__(self, message: str, differences: list[tuple[str, str, str]]):
        super().__init__(message)
        self.differences = differences


class ArchMismatch(FingerprintMismatch):
    """The visible GPU is not the bundle's target (arch or SM count)."""

    exit_code = 21


class ServeMismatch(KernelcacheError):
    """``run --strict``: the served command differs from the bundle's in a flag that changes kernel keys."""

    exit_code = 22


class EngineCompileMismatch(KernelcacheError):
    """vLLM would not find the bundle's compile artifact here: a factor of its hash (a hashed ``VLLM_*`` variable, a
    config field, the product) or what the artifact pins (the Python and torch versions) differs."""

    exit_code = 23


class MissingDependency(KernelcacheError):
    """A package the command needs (triton, vllm, flashinfer, oras) is not importable."""

    exit_code = 30


class PathUnavailable(KernelcacheError):
    """The build plan asks for a code path the installed vLLM does not have."""

    exit_code = 31


class ReleaseUnsupported(KernelcacheError):
    """The installed vLLM is a release kernelcache does not build for, or one that lacks a path the plan asks for."""

    exit_code = 36


class AlreadyActivated(KernelcacheError):
    """Triton already fixed its cache dir in this process; activate() came too late."""

    exit_code = 32


class ToolchainUnavailable(MissingDependency):
    """The CUDA toolchain that builds FlashInfer's module could not be obtained (no network, no disk)."""

    exit_code = 33


class ImportFailed(MissingDependency):
    """A package the build needs is installed but does not import here (the error it raised is named)."""

    exit_code = 34


class PackageClash(MissingDependency):
    """Two installed packages wrote the same files and the later one's copy replaced the other's (cuda-python
    12.6's ``cuda/bindings`` over cuda-bindings 13's): the package that owns them fails to import."""

    exit_code = 35


class UnknownArchitecture(KernelcacheError):
    """The serve command's model is an architecture the installed vLLM does not know."""

    exit_code = 37


class StorageError(KernelcacheError):
    """Disk full, permission denied, read-only target: nothing was published."""

    exit_code = 40


class BaseUnusable(KernelcacheError):
    """The read-only base given to --read-only is not a complete installed cache."""

    exit_code = 41


class ReadOnlyCache(KernelcacheError):
    """The cache dir cannot be written and no overlay was asked for: Triton would crash on its first miss."""

    exit_code = 42


class NotInstalled(KernelcacheError):
    """``rm``: no bundle installed in the cache dir has that name or digest, or the name is ambiguous."""

    exit_code = 43


class NotACacheDir(KernelcacheError):
    """``ls`` / ``rm`` / ``prune``: the path is not a kernelcache cache dir (missing, or no ``.kernelcache``
    state in it), or its state cannot be read (an install receipt that does not parse)."""

    exit_code = 44


class CompilesDetected(KernelcacheError):
    """verify saw at least one real compile (a cache miss)."""

    exit_code = 50


class NothingVerified(KernelcacheError):
    """verify had nothing to run: the plan's paths and dtypes select no task and no FlashInfer module."""

    exit_code = 52


class NothingTuned(KernelcacheError):
    """tune ran the bundle's plan and no autotuned kernel left a choice to keep."""

    exit_code = 54


class FlashInferUnverified(KernelcacheError):
    """verify could not find, load or (on a GPU) call an installed FlashInfer module through FlashInfer."""

    exit_code = 53


class BuildFailed(KernelcacheError):
    """An exercise worker failed."""

    exit_code = 51


class RemoteError(KernelcacheError):
    """A registry or URL transfer failed."""

    exit_code = 60


class MergeConflict(KernelcacheError):
    """Two bundles cannot be merged: different targets or fingerprints."""

    exit_code = 61
