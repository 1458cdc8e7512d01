#!/usr/bin/env python3
"""Write a copy of a bundle without its ``triton_identity`` record (for benchmarks against older trees).

    python scripts/strip_identity.py IN.tar.zst OUT.tar.zst

A kernelcache from before the record refuses a manifest that has it (an unknown top-level field); the copy
holds the same members and the same manifest otherwise, as bundles were written before the record.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from kernelcache.format import archive


def main(source: Path, out: Path) -> None:
    manifest = dataclasses.replace(archive.read_manifest(source), triton_identity=None)
    members = {name: blob for _, name, blob in archive.iter_members(source)}
    archive.write(out, manifest, [(name, lambda blob=blob: blob) for name, blob in members.items()])


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
