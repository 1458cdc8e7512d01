"""The bundle manifest: frozen dataclasses with a JSON round trip and a schema version.

A manifest pins everything a Triton cache key depends on (``Environment``), names the target
(``Target``), and lists every file of the bundle with its size and sha256, grouped by what it is:
a compiled kernel (``Kernel``), a C helper module Triton builds with gcc (``Module``: launchers and
``cuda_utils``), a FlashInfer JIT module (``FlashInferModule``), an autotune choice ``kernelcache tune``
timed on a GPU (``Tuning``), or the record of Triton's dependency walks of the build's ``@jit`` functions
(``TritonWalks``). docs/FORMAT.md is the reference.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import BundleManifestError, UsageError
from ..hooks.kernelcache_autotune import SUFFIX as AUTOTUNE_SUFFIX
from ..hooks.kernelcache_listener import json_value  # the compile log's hook writes constexprs with it
from ..hooks.kernelcache_walks import BUNDLE_DIR as WALKS_DIR
from ..hooks.kernelcache_walks import BUNDLE_FILE as WALKS_FILE
from . import canonical

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# The paths whose kernels vLLM configured by the GPU's device name when bundles did not yet record what the name
# decided (``Target.device_keys``): read only for such a bundle. A bundle built since records it, whichever family
# built it (the families say which they are: plan/families/, ``Family.keys_follow_device``).
UNRECORDED_DEVICE_NAME_PATHS = ("moe", "mamba")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX16 = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class Member:
    """One future bundle member: its path in the bundle and where its bytes come from."""

    path: str
    source: Path | None = None
    data: bytes | None = None

    def read(self) -> bytes:
        return self.data if self.data is not None else self.source.read_bytes()


@dataclass(frozen=True)
class FileRecord:
    """One member of the bundle. ``path`` is relative to the cache root: ``<key>/<file>``."""

    path: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError("file path must be a non-empty string")
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 0:
            raise ValueError(f"{self.path}: size must be a non-negative integer")
        if not isinstance(self.sha256, str) or not _HEX64.fullmatch(self.sha256):
            raise ValueError(f"{self.path}: sha256 must be 64 lowercase hex digits")


@dataclass(frozen=True)
class DeviceTable:
    """A tuned-config table vLLM chose kernel configs from by the GPU's device name (exercise/device_tables.py)."""

    path: str  # the build path whose exercise looked it up ("moe", "mamba")
    loader: str | None  # vLLM's loader ("...fused_moe.fused_moe.get_moe_configs"); None: a lookup of no known loader
    looked_for: str | None  # the file name vLLM looked for under the build's device name
    file: str | None  # the file it read; None: none was there, vLLM's default config
    sha256: str | None  # of that file
    configs_sha256: str | None = None  # of the loader's answer, canonical JSON


@dataclass(frozen=True)
class DeviceKeys:
    """What the device name decided: a bundle whose kernels depend on it serves the products in ``serves``."""

    device: str  # the device name the build ran under ("NVIDIA H200")
    tables: tuple[DeviceTable, ...]
    serves: dict[str, str]  # profile -> device name: those of the arch and SM count with the same configs everywhere

    def accepts(self, device: str) -> bool:
        """Whether a GPU of this device name gets this bundle's kernels."""
        return device == self.device or device in self.serves.values()


@dataclass(frozen=True)
class Target:
    backend: str
    arch: str  # "sm_90", "sm_100"; the cubins inside are sm_90a / sm_100a
    warp_size: int = 32
    gpu: str | None = None  # GPU profile name ("h200") when the build depended on it
    sm_count: int | None = None  # multiprocessor count the split top-p kernels were built for
    device_keys: DeviceKeys | None = None  # set when kernels depend on the device name; left out of the JSON if None

    @property
    def capability(self) -> int:
        return arch_to_capability(self.arch)


@dataclass(frozen=True)
class Environment:
    """What Triton hashes into every cache key, plus the versions that pick the kernel sources."""

    python: str  # "cp312": each cpython minor ships its own libtriton.so
    platform: str  # "x86_64-linux": launchers are native code
    triton: str | None
    triton_key_sha256: str | None
    ptxas: dict[str, str] = field(default_factory=dict)  # arch -> `ptxas --version` text as Triton sees it
    env_vars: dict[str, str] = field(default_factory=dict)  # cache-invalidating variables that were set
    torch: str | None = None
    vllm: str | None = None
    flashinfer: str | None = None


@dataclass(frozen=True)
class Kernel:
    name: str
    key: str  # the cache directory name, base32(sha256(cache key))
    num_warps: int
    num_stages: int
    files: tuple[FileRecord, ...]
    signature: dict[str, str] | None = None  # parameter -> Triton type, in parameter order
    constexprs: dict[str, Any] | None = None  # parameter -> value (None: not recorded)
    attrs: dict[str, list] | None = None  # parameter -> specialization attributes (tt.divisibility)


@dataclass(frozen=True)
class Module:
    """A C extension Triton compiles with gcc and caches beside the kernels."""

    kind: str  # "launcher" | "cuda_utils" | "other"
    key: str
    files: tuple[FileRecord, ...]


FLASHINFER_ROOT = "flashinfer"  # members: flashinfer/<version>-<archs>-<sha12>/<name>/<name>.so (docs/FLASHINFER.md)


@dataclass(frozen=True)
class FlashInferModule:
    name: str  # "sampling", or a JIT module's URI ("batch_prefill_with_kv_cache_dtype_q_bf16_..._sm90")
    version: str  # flashinfer-python version it was built from
    cuda: str  # CUDA toolkit version (nvcc)
    archs: tuple[str, ...]  # ("sm90a",)
    tvm_ffi: str | None
    files: tuple[FileRecord, ...]
    sources: tuple[str, ...] = ()  # its source files inside the flashinfer package ("flashinfer/data/csrc/...")
    sources_sha256: str | None = None  # of those files' names and bytes (exercise/vllm_flashinfer.py sources_digest)


@dataclass(frozen=True)
class Build:
    tool: str  # "kernelcache 0.1.0"
    mode: str  # pack | cross | native | capture | merge
    source_date_epoch: int = 0
    keep_ir: bool = False
    plan: dict | None = None
    coverage: dict | None = None
    skipped: tuple[dict, ...] = ()


@dataclass(frozen=True)
class TritonIdentity:
    """A bundle's record of the Triton it was built with, by content (the manifest's ``triton_identity``)."""

    files: dict[str, str]  # every file triton_key() reads, relative to Triton's dir -> content identity
    triton_key: str  # triton_key() itself: served processes take it instead of hashing libtriton.so
    variables: tuple[str, ...] = ()  # the key candidates set in the build's exercise processes
    ptxas: dict[str, str] = field(default_factory=dict)  # arch -> the ptxas Triton ran, relative to its dir


@dataclass(frozen=True)
class Tuning:
    """Autotune choices and the GPU they were timed on (the manifest's ``tuning``, written by ``kernelcache tune``).

    ``files`` are Triton's own ``<key>/<kernel>.autotune.json`` files (``Autotuner.check_disk_cache``): the
    timings of every candidate config under a key that hashes Triton, the target, the kernel source, the set
    cache-invalidating variables, the tuning key and the candidate list, but not the GPU product. So the
    product they were timed on is recorded here, and ``install`` installs them only where it is the GPU's."""

    product: str  # the GPU's name as the driver reports it ("NVIDIA H200")
    driver: str | None  # the NVIDIA driver's version ("580.159.04"); None where nvidia-smi was not there
    cuda: str | None  # the CUDA version the driver supports ("13.0", cuDriverGetVersion)
    clocks: dict[str, int]  # MHz: "sm" / "memory" (application clocks), "max_sm" / "max_memory"
    files: tuple[FileRecord, ...]

    def kernels(self) -> list[str]:
        """The kernels that have a choice, by name (one per file; a kernel tuned for several keys repeats)."""
        return [f.path.rsplit("/", 1)[-1].removesuffix(AUTOTUNE_SUFFIX) for f in self.files]

    def where(self) -> str:
        """Where the choices were timed, in one line."""
        clocks = ", ".join(f"{k} {v} MHz" for k, v in sorted(self.clocks.items()))
        parts = [f"driver {self.driver}" if self.driver else None, f"CUDA {self.cuda}" if self.cuda else None,
                 clocks or None]
        return f"{self.product} ({'; '.join(p for p in parts if p) or 'no driver details'})"


@dataclass(frozen=True)
class TritonWalks:
    """Records of Triton's dependency walks of the build's ``@jit`` functions (the manifest's ``walks``): each file
    ``triton-walks/<sha256 prefix>/walks.json`` is installed into the cache dir, where served processes replay a walk
    instead of making it while everything the record read still holds (hooks/kernelcache_walks.py). Nothing in one
    names a path: functions by module and name, sources by sha256, Triton by its ``triton_key()``."""

    files: tuple[FileRecord, ...]


def walks_member(record: dict) -> Member:
    """A build's walk record as its bundle member: canonical JSON, named by its digest (bundles that carry the same
    record share one entry dir of the cache)."""
    data = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return Member(f"{WALKS_DIR}/{hashlib.sha256(data).hexdigest()[:16]}/{WALKS_FILE}", data=data)


def walks_path(path: str) -> bool:
    """Whether ``path`` is where a walk record lives: ``triton-walks/<16 hex digits>/walks.json``."""
    parts = path.split("/")
    return len(parts) == 3 and parts[0] == WALKS_DIR and _HEX16.fullmatch(parts[1]) is not None and (
        parts[2] == WALKS_FILE)


# vLLM's torch.compile artifacts: vllm-compile/<16 hex>/{compile.json,torch_compile_cache.tar}
ENGINE_ROOT = "vllm-compile"
ENGINE_FILES = ("compile.json", "torch_compile_cache.tar")


@dataclass(frozen=True)
class EngineCompile:
    """vLLM's own torch.compile artifacts (the manifest's ``engine``; enginecompile.py): per artifact its record
    ``vllm-compile/<16 hex>/compile.json`` and vLLM's ``torch_compile_cache`` tree as a tar beside it."""

    files: tuple[FileRecord, ...]


def engine_path(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 3 and parts[0] == ENGINE_ROOT and _HEX16.fullmatch(parts[1]) is not None and (
        parts[2] in ENGINE_FILES)


def engine_record(data: Any) -> EngineCompile | None:
    if data is None:
        return None
    engine = _build(EngineCompile, data, files=_records)
    wrong = [f.path for f in engine.files if not engine_path(f.path)]
    if wrong or not engine.files:
        raise ValueError(f"engine lists {wrong[0]!r}, not {ENGINE_ROOT}/<16 hex digits>/{'|'.join(ENGINE_FILES)}"
                         if wrong else "engine lists no file")
    return engine


@dataclass(frozen=True)
class Manifest:
    target: Target
    environment: Environment
    build: Build
    kernels: tuple[Kernel, ...] = ()
    modules: tuple[Module, ...] = ()
    flashinfer: tuple[FlashInferModule, ...] = ()
    format_version: int = FORMAT_VERSION
    triton_identity: TritonIdentity | None = None  # format/identity.py; left out of the JSON when None
    tuning: Tuning | None = None  # autotune choices (kernelcache tune); left out of the JSON when None
    walks: TritonWalks | None = None  # Triton's walks of the build's @jit functions; left out of the JSON when None
    engine: EngineCompile | None = None  # vLLM's torch.compile artifacts; left out of the JSON when None

    def files(self, choices: bool = True) -> Iterator[FileRecord]:
        """Every member (``choices``: the autotune files too; an install that skips them publishes the rest)."""
        for group in (self.kernels, self.modules, self.flashinfer):
            for item in group:
                yield from item.files
        if self.walks is not None:
            yield from self.walks.files
        if self.engine is not None:
            yield from self.engine.files
        if choices and self.tuning is not None:
            yield from self.tuning.files

    def file_map(self) -> dict[str, FileRecord]:
        return {f.path: f for f in self.files()}

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files())

    @property
    def device_keys(self) -> DeviceKeys | None:
        """What the device name decided: the target's record, or for a bundle built before kernelcache recorded
        it, what its plan implies (a moe or mamba path, built for one profile's device name, serves that one)."""
        if self.target.device_keys is not None:
            return self.target.device_keys
        plan = self.build.plan if isinstance(self.build.plan, dict) else {}
        if not set(plan.get("paths") or ()) & set(UNRECORDED_DEVICE_NAME_PATHS):
            return None
        products = {g.get("name"): g.get("product") for g in plan.get("gpus") or () if isinstance(g, dict)}
        device = products.get(self.target.gpu)
        return DeviceKeys(device, (), {self.target.gpu: device}) if isinstance(device, str) else None

    def to_dict(self) -> dict:
        """The manifest as JSON data, made once per manifest (an install needs it for the digest, the receipt and
        the journal: ~70 ms each for a 400-kernel bundle). Shared between callers: read it, never change it."""
        return self._data

    @functools.cached_property
    def _data(self) -> dict:
        try:
            data = canonical.plain(self)  # what the line below gives, without asdict's deep copy (~20 ms)
        except canonical.Unusual:
            data = _plain(asdict(self))
        if self.triton_identity is None:  # bundles without one keep their bytes (and digests)
            del data["triton_identity"]
        if self.target.device_keys is None:  # likewise: bundles whose kernels no device name decided
            del data["target"]["device_keys"]
        if self.tuning is None:  # likewise: bundles nobody tuned
            del data["tuning"]
        if self.walks is None:  # likewise: bundles without walk records
            del data["walks"]
        if self.engine is None:  # likewise: bundles without vLLM's compile artifact
            del data["engine"]
        for module in data.get("flashinfer", ()):  # likewise: modules built without a record of their sources
            if module.get("sources_sha256") is None:
                del module["sources"], module["sources_sha256"]
        return data

    def to_json(self) -> bytes:
        """The canonical form, whose sha256 is the bundle's digest: ``json.dumps(to_dict(), indent=1)`` and a
        newline (format/canonical.py writes the same bytes without json's pure-Python encoder, ~20 ms)."""
        data = self.to_dict()
        try:
            text = canonical.dumps(data)
        except canonical.Unusual:
            text = json.dumps(data, indent=1, allow_nan=False)
        return (text + "\n").encode()

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        if not isinstance(data, Mapping):
            raise BundleManifestError("manifest.json is not a JSON object")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise BundleManifestError(
                f"manifest format_version {version!r} is not supported (this kernelcache reads {FORMAT_VERSION})"
            )
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise BundleManifestError(f"manifest.json has unknown top-level field(s): {', '.join(sorted(unknown))}")
        try:
            return _consistent(Manifest(
                format_version=version,
                target=_build(Target, data["target"], device_keys=device_keys),
                environment=_build(Environment, data["environment"]),
                build=_build(Build, data["build"], skipped=tuple),
                kernels=tuple(_build(Kernel, k, files=_records) for k in data.get("kernels", ())),
                modules=tuple(_build(Module, m, files=_records) for m in data.get("modules", ())),
                flashinfer=tuple(flashinfer_module(m) for m in data.get("flashinfer", ())),
                triton_identity=identity_record(data.get("triton_identity")),
                tuning=tuning_record(data.get("tuning")),
                walks=walks_record(data.get("walks")),
                engine=engine_record(data.get("engine")),
            ))
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleManifestError(f"manifest.json is malformed: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_json(cls, raw: bytes | str) -> Manifest:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BundleManifestError(f"manifest.json is not valid JSON: {exc}") from None
        return cls.from_dict(data)


_ARCH = re.compile(r"(?:sm_?)?([1-9][0-9]{1,2})[af]?")


def capability_of(arch: str) -> int | None:
    """"sm_90" / "sm_90a" / "sm_100f" / "90" -> 90; None for what is not a CUDA arch (the one arch parser)."""
    found = _ARCH.fullmatch(arch.strip().lower())
    return int(found.group(1)) if found else None


def arch_to_capability(arch: str) -> int:
    """``capability_of``, with a ``ValueError`` for what is not a CUDA arch."""
    capability = capability_of(arch)
    if capability is None:
        raise ValueError(f"not a CUDA arch: {arch!r} (expected e.g. sm_90 or sm_100)")
    return capability


# The compute capabilities CUDA GPUs have (NVIDIA's CUDA GPU list and nvcc's --list-gpu-arch, CUDA 13).
CUDA_CAPABILITIES = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121)


def flag_capability(arch: str, flag: str | None = "--arch") -> int:
    """An arch a user gave: its capability, or a one-line ``UsageError`` naming ``flag`` (None: naming the arch
    alone, as ``arch_to_capability`` does) for what is not an arch, or one no CUDA GPU has (``CUDA_CAPABILITIES``)."""
    try:
        capability = arch_to_capability(arch)
    except ValueError as exc:
        if flag is None:
            raise UsageError(str(exc)) from None
        raise UsageError(f"{flag} must look like sm_90 or sm_100, got {arch!r}") from None
    if capability not in CUDA_CAPABILITIES:
        known = ", ".join(f"sm_{c}" for c in CUDA_CAPABILITIES if c >= 80)
        raise UsageError(f"{flag + ' ' if flag else ''}{arch}: unknown arch, no CUDA GPU has it (known: {known}, "
                         "and older ones)")
    return capability


def capability_to_arch(capability: int) -> str:
    return f"sm_{capability}"


def _consistent(manifest: Manifest) -> Manifest:
    """The identity record's ``triton_key`` must be the one the environment's ``triton_key_sha256`` names: the
    manifest has no checksum of its own, and a record that disagrees with its bundle is not one to trust."""
    record = manifest.triton_identity
    if record is not None and hashlib.sha256(record.triton_key.encode()).hexdigest() != (
            manifest.environment.triton_key_sha256):
        raise ValueError("triton_identity.triton_key does not hash to environment.triton_key_sha256")
    return manifest


def identity_record(data: Any) -> TritonIdentity | None:
    """A ``triton_identity`` from its JSON form (None stays None); ``ValueError``/``TypeError`` if malformed."""
    if data is None:
        return None
    record = _build(TritonIdentity, data, files=dict, variables=tuple, ptxas=dict)
    values = (*record.files.values(), *record.ptxas.values(), *record.variables, record.triton_key)
    if not all(isinstance(v, str) for v in values):
        raise ValueError("triton_identity holds a value that is not a string")
    return record


def device_keys(data: Any) -> DeviceKeys | None:
    """A target's ``device_keys`` from its JSON form (None stays None)."""
    if data is None:
        return None
    keys = _build(DeviceKeys, data, tables=lambda items: tuple(_build(DeviceTable, t) for t in items), serves=dict)
    if not all(isinstance(s, str) for s in (keys.device, *keys.serves, *keys.serves.values())):
        raise ValueError("target.device_keys holds a value that is not a string")
    return keys


def tuning_record(data: Any) -> Tuning | None:
    """A manifest's ``tuning`` from its JSON form (None stays None)."""
    if data is None:
        return None
    tuning = _build(Tuning, data, files=_records, clocks=dict)
    if not isinstance(tuning.product, str) or not all(isinstance(v, str) for v in (tuning.driver, tuning.cuda)
                                                          if v is not None):
        raise ValueError("tuning names its GPU with a value that is not a string")
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in tuning.clocks.items()):
        raise ValueError("tuning.clocks must map names to whole MHz")
    return tuning


def walks_record(data: Any) -> TritonWalks | None:
    """A manifest's ``walks`` from its JSON form (None stays None)."""
    if data is None:
        return None
    walks = _build(TritonWalks, data, files=_records)
    wrong = [f.path for f in walks.files if not walks_path(f.path)]
    if wrong or not walks.files:
        raise ValueError(f"walks lists {wrong[0]!r}, not {WALKS_DIR}/<16 hex digits>/{WALKS_FILE}" if wrong
                         else "walks lists no file")
    return walks


def _records(items: Any) -> tuple[FileRecord, ...]:
    return tuple(_build(FileRecord, f) for f in items)


def flashinfer_module(data: Any) -> FlashInferModule:
    """One entry of a manifest's ``flashinfer`` list (``TypeError`` / ``ValueError`` when it is not one)."""
    return _build(FlashInferModule, data, files=_records, archs=tuple, sources=tuple)


def _build(cls: type, data: Any, **converters: Any) -> Any:
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__} must be an object")
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(sorted(unknown))}")
    values = {k: converters[k](v) if k in converters else v for k, v in data.items()}
    return cls(**values)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return json_value(value)
