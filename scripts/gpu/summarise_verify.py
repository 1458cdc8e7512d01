"""Summarise an h200_verify.sh run: verify outcomes and whether bundles a, b, c hold the same kernels."""

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from kernelcache.format import archive  # noqa: E402

root = Path(sys.argv[1])


def load(name):
    try:
        return json.loads((root / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": str(exc), "stderr": (root / name.replace(".json", ".err")).read_text()[-3000:]
                if (root / name.replace(".json", ".err")).exists() else None}


summary = {"builds": {}, "verify": {}, "read_only": (root / "ro.mode").read_text().strip()}
bundles = {}
for x in "abc":
    path = root / "bundles" / x / "vllm-sampler-sm_90-h200.tar.zst"
    if path.exists():
        m = archive.read_manifest(path)
        files = {name: hashlib.sha256(data).hexdigest() for _, name, data in archive.iter_members(path)}
        bundles[x] = {"keys": sorted(k.key for k in m.kernels), "files": files, "mode": m.build.mode,
                      "python": m.environment.python, "triton_key": m.environment.triton_key_sha256[:16],
                      "kernels": len(m.kernels), "modules": len(m.modules), "size": path.stat().st_size}
for x, b in bundles.items():
    summary["builds"][x] = {k: v for k, v in b.items() if k not in ("keys", "files")}
if "a" in bundles:
    for x in "bc":
        if x in bundles:
            same = {n for n in bundles["a"]["files"] if bundles[x]["files"].get(n) == bundles["a"]["files"][n]}
            summary["builds"][x]["same_keys_as_native"] = bundles[x]["keys"] == bundles["a"]["keys"]
            kernel_files = [n for n in bundles["a"]["files"] if not n.endswith(".so")]
            identical = sum(n in same for n in kernel_files)
            summary["builds"][x]["kernel_files_identical_to_native"] = f"{identical}/{len(kernel_files)}"
for x in ["a", "b", "c", "ro"]:
    report = load(f"verify-{x}.json")
    fields = ("ok", "mode", "compiles", "hits", "gcc_builds", "files_written", "seconds", "cache_dir", "error",
              "stderr")
    summary["verify"][x] = {k: report.get(k) for k in fields}
    rc = root / f"verify-{x}.rc"
    summary["verify"][x]["rc"] = rc.read_text().strip() if rc.exists() else None
print(json.dumps(summary, indent=1))
