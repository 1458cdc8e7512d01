"""Summarise an h200_build_cache.sh run: per build (plain, cold, warm) its compiles, build-cache counts, seconds and
the sha256 of each bundle; whether the three builds' bundles are byte-identical; what ``kernelcache verify`` of the
warm build's bundle found. Prints JSON.

    python3 scripts/gpu/summarise_build_cache.py OUT > OUT/build_cache.json
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

BUILDS = ("plain", "cold", "warm")


def build_row(out: Path, name: str) -> dict:
    try:
        [target] = json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{exc}: {(out / f'{name}.err').read_text()[-1500:]}"}
    return {"compiles": target["compiles"], "build_cache": target["build_cache"], "seconds": target["seconds"],
            "bundles": {Path(b["path"]).name: hashlib.sha256(Path(b["path"]).read_bytes()).hexdigest()
                        for b in target["bundles"]}}


def verify_row(out: Path) -> dict:
    try:
        report = json.loads((out / "verify.json").read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{exc}: {(out / 'verify.err').read_text()[-1500:]}"}
    return {k: report.get(k) for k in ("ok", "compiles", "hits", "gcc_builds", "files_written")}


def main() -> int:
    if len(sys.argv) != 2:
        raise SystemExit("usage: summarise_build_cache.py OUT")
    out = Path(sys.argv[1])
    summary: dict = {"env": (out / "env.txt").read_text()}
    summary.update({name: build_row(out, name) for name in BUILDS})
    digests = [summary[name].get("bundles") for name in BUILDS]
    summary["byte_identical"] = digests[0] is not None and digests.count(digests[0]) == len(BUILDS)
    summary["verify"] = verify_row(out)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
