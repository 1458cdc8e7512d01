"""What a bundle holds, summarised for people (tables) and machines (the manifest as JSON)."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..format.archive import Limits, bundle_digest, read_manifest
from ..format.manifest import Manifest
from .signature import SignatureInfo, signature_info


@dataclass(frozen=True)
class KernelSummary:
    name: str
    variants: int
    size: int
    num_warps: tuple[int, ...]


@dataclass(frozen=True)
class BundleInfo:
    path: Path
    manifest: Manifest
    digest: str
    compressed_size: int
    signature: SignatureInfo  # who signed it (B.tar.zst.sig beside it), checked with the key each signature carries

    @property
    def kernels(self) -> list[KernelSummary]:
        groups: dict[str, list] = defaultdict(list)
        for kernel in self.manifest.kernels:
            groups[kernel.name].append(kernel)
        return [
            KernelSummary(name, len(ks), sum(f.size for k in ks for f in k.files),
                          tuple(sorted({k.num_warps for k in ks})))
            for name, ks in sorted(groups.items())
        ]

    def to_dict(self) -> dict:
        """The manifest, with the bundle's digest, compressed size and signature (``kernelcache inspect --json``)."""
        return {"digest": self.digest, "compressed_size": self.compressed_size,
                "signature": self.signature.to_dict(), **self.manifest.to_dict()}

    @property
    def module_counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for module in self.manifest.modules:
            counts[module.kind] += 1
        return dict(counts)


def inspect(bundle: str | os.PathLike, limits: Limits | None = None,
            trusted_keys: tuple[str, ...] = ()) -> BundleInfo:
    """What ``bundle`` holds, and who signed it (with ``trusted_keys``, checked against those key files)."""
    path = Path(bundle)
    manifest = read_manifest(path, limits)
    return BundleInfo(path, manifest, bundle_digest(manifest), path.stat().st_size,
                      signature_info(path, trusted_keys))


def human_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
