"""A CPU-built bundle's Triton identity record (docs/FORMAT.md, ``triton_identity``) against this host's own Triton,
in one process: the fingerprint taken from the record (format/identity.py, before Triton is imported) and Triton's
own (``fingerprint.local_environment``), field by field, and the seconds each took. Prints JSON.

    python3 scripts/gpu/identity_check.py BUNDLE.tar.zst
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

from kernelcache.format import archive
from kernelcache.format.envscan import package_dir
from kernelcache.format.fingerprint import local_environment, package_version
from kernelcache.format.identity import environment_from


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit("usage: identity_check.py BUNDLE.tar.zst")
    manifest = archive.read_manifest(sys.argv[1])
    started = time.perf_counter()
    fast = environment_from(manifest.triton_identity, manifest.environment, ["sm_90"], package_dir("triton"),
                            package_version)
    fast_s = time.perf_counter() - started
    imported = "triton" in sys.modules
    started = time.perf_counter()
    own = asdict(local_environment(["sm_90"]))
    own_s = time.perf_counter() - started
    fast = asdict(fast) if fast else None
    print(json.dumps({"record_used": fast is not None, "equal": fast == own, "imported_before": imported,
                      "record_s": round(fast_s, 4), "triton_s": round(own_s, 4),
                      "differs": sorted(k for k in own if fast and fast[k] != own[k]),
                      "bundle_env_equal": own == asdict(manifest.environment), "own": own}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
