#!/usr/bin/env python3
"""Seed an empty Triton cache dir with a tuned bundle's autotune choices alone (no kernel): a cold process on it
compiles every kernel as a cold server does, and its autotuner takes the bundle's choices instead of timing.
Its outputs, set beside the tuned bundle's, show that the bundle serves what a cold process computes when its
autotuner picks the same configs (two cold processes may pick differently: timing noise between near-equal
configs).

    python scripts/gpu/seed_choices.py TUNED_BUNDLE CACHE_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernelcache.format.archive import iter_members, read_manifest  # noqa: E402


def seed(bundle: str, cache_dir: str) -> int:
    choices = {f.path for f in read_manifest(bundle).tuning.files}
    root = Path(cache_dir)
    written = 0
    for _, name, data in iter_members(bundle):
        path = next((c for c in choices if name.endswith(c)), None)
        if path is not None:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
            written += 1
    if written != len(choices):
        sys.exit(f"seed_choices: {written} of {len(choices)} choices found in {bundle}")
    return written


if __name__ == "__main__":
    print(f"seeded {seed(sys.argv[1], sys.argv[2])} choices into {sys.argv[2]}")
