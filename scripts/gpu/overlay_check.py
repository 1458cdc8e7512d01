#!/usr/bin/env python3
"""The read-only overlay, once on a real GPU: build, pack, install, move, make read-only, serve, replay.

Run from the repository root on the GPU machine (see docs/RELIABILITY.md, "H200 check"):

    python3 scripts/gpu/overlay_check.py            # writes $OUT/gpu_overlay_check.json
    python3 scripts/gpu/overlay_check.py --fake     # the same steps on a CPU box, fake sm_90 target

Steps, each in its own process as in production:
1. build: kernelcache's test kernels launched for real on the GPU (a native worker) into a fresh cache;
2. ``kernelcache pack`` that cache; ``kernelcache install`` the bundle elsewhere; move the install
   (its group files now name paths that are gone, as when an image layer is mounted elsewhere);
   make it read-only (a read-only bind mount, else a read-only tmpfs copy, else permission bits
   with root's DAC capabilities dropped; the JSON says which, and whether a write was refused);
3. serve twice: ``kernelcache run --read-only --base RO --overlay OV -- python3 <this> --child``.
   The child launches the bundled kernels and two specializations the bundle lacks, checks the
   results against torch, and reports compile hits and misses and first-call times;
4. replay: a native worker compiles the miss log's targets (``kernelcache.plan.misses``) into a
   fresh cache; the keys must be the misses' keys;
5. control: plain Triton (no overlay) on the read-only base.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
DROP = "-dac_override,-dac_read_search,-fowner"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fake", action="store_true", help="no GPU: fake sm_90 target, kernels not executed")
    parser.add_argument("--child", metavar="OUT_JSON", help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help="scratch dir [default: a new temp dir]")
    args = parser.parse_args()
    if args.child:
        return child(Path(args.child), args.fake)
    out = Path(os.environ.get("OUT") or ".") / "gpu_overlay_check.json"
    report: dict = {"started": time.time(), "fake": args.fake, "host": environment(args.fake)}
    work = Path(args.work or tempfile.mkdtemp(prefix="kc-overlay-"))
    try:
        run_all(work, args.fake, report)
    except Exception as exc:  # noqa: BLE001 -- the report says where it stopped
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        cleanup(work / "ro")
    report["seconds"] = time.time() - report["started"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps({k: report.get(k) for k in ("verdict", "error", "read_only")}, indent=1))
    print(f"wrote {out}")
    return 0 if report.get("verdict") == "pass" else 1


def environment(fake: bool) -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in ("torch", "triton", "zstandard", "click", "filelock", "rich"):
        try:
            info[name] = importlib.metadata.version(name)
        except Exception as exc:  # noqa: BLE001
            info[name] = f"missing: {exc}"
    if not fake:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = list(torch.cuda.get_device_capability(0))
    return info


def run_all(work: Path, fake: bool, report: dict) -> None:
    capability = 90 if fake else _capability()
    report["capability"] = capability
    build = work / "build"
    result, compiled = worker(work / "w-build", build, capability, fake,
                              [{"call": "kernelcache.exercise.testkernels:run", "kwargs": {"device": _device(fake)}}])
    report["build"] = {"ok": result["ok"], "compiles": len(compiled), "seconds": result["seconds"]}

    bundle = work / "bundle.tar.zst"
    kc("pack", str(build), "-o", str(bundle), "--compile-log", str(work / "w-build" / "compiles.jsonl"))
    kc("install", str(bundle), "--cache-dir", str(work / "orig" / "cache"), *(["--no-gpu-check"] if fake else []))
    (work / "orig").rename(work / "moved")
    base = work / "ro" / "cache"
    method, prefix = make_read_only(work / "moved", work / "ro")
    report["read_only"] = {"method": method, "write_refused": write_refused(base, prefix)}
    before = snapshot(work / "moved")

    overlay = work / "overlay"
    serve = [*prefix, sys.executable, "-m", "kernelcache", "run", "--read-only", "--base", str(base), "--overlay",
             str(overlay), "--", sys.executable, str(Path(__file__).resolve()), "--child"]
    runs = []
    for n in (1, 2):
        out = work / f"serve{n}.json"
        done = subprocess.run([*serve, str(out), *(["--fake"] if fake else [])], cwd=ROOT, env=child_env(),
                              capture_output=True, text=True, timeout=900)
        runs.append(json.loads(out.read_text()) if out.exists() else {"error": done.stderr[-3000:]})
    log = overlay / ".kernelcache" / "misses.jsonl"
    misses = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    report["serve"] = runs
    report["miss_log"] = [{k: r.get(k) for k in ("kind", "kernel", "key", "num_warps", "constexprs", "fn_module")}
                          for r in misses]
    report["base_unchanged"] = snapshot(work / "moved") == before

    from kernelcache.plan.misses import replay_tasks

    tasks = [{"call": t.call, "kwargs": t.kwargs, "label": t.label} for t in replay_tasks(log, capability)]
    replayed, recompiled = worker(work / "w-replay", work / "replayed", capability, fake, tasks)
    report["replay"] = {"ok": replayed["ok"], "summary": replayed["tasks"][0].get("summary") if tasks else None,
                        "keys_equal": sorted(r["key"] for r in recompiled if not r["cache_hit"]) ==
                        sorted(r["key"] for r in misses if r["kind"] == "kernel")}

    variants = {"call": "kernelcache.exercise.testkernels:run_variants", "kwargs": {"device": _device(fake)}}
    control, _ = worker(work / "w-control", base, capability, fake, [variants], prefix=prefix, check=False)
    report["control_plain_triton"] = {"ok": control.get("ok"),
                                      "error": (control.get("tasks") or [{}])[0].get("error", "")[:300]}
    report["verdict"] = verdict(report, misses)


def verdict(report: dict, misses: list[dict]) -> str:
    first, second = report["serve"]
    checks = {
        "build ok": report["build"]["ok"],
        "first run: every bundled kernel hit": first.get("bundled_misses") == 0 and first.get("bundled_hits", 0) > 0,
        "first run: the 2 new specializations missed": first.get("variant_misses") == 2,
        "first run: outputs correct": all(first.get("correct", {}).values()) if not report["fake"] else True,
        "second run: all hits": second.get("misses") == 0,
        "miss log: 2 kernels with specialization": sum(1 for r in misses if r["kind"] == "kernel") == 2,
        "base unchanged": report["base_unchanged"],
        "replay: same keys": report["replay"]["keys_equal"] and report["replay"]["ok"],
    }
    report["checks"] = checks
    return "pass" if all(checks.values()) else "fail"


# -- the served child -----------------------------------------------------------------------------


def child(out: Path, fake: bool) -> int:
    """Runs under `kernelcache run --read-only`: launch, check, count hits and misses."""
    events: list[dict] = []
    from kernelcache.hooks import kernelcache_listener

    kernelcache_listener.install(None, also=events.append)
    if fake:
        from kernelcache.exercise import fake_target

        fake_target.activate(90, 132)
    from kernelcache.exercise import testkernels

    started = time.perf_counter()
    testkernels.run(_device(fake))
    bundled = list(events)
    correct = {} if fake else check_outputs(testkernels)
    variant_start = len(events)
    first_variant = time.perf_counter()
    testkernels.run_variants(_device(fake))
    _sync(fake)
    variants = events[variant_start:]
    report = {
        "env": {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "TRITON_CACHE_MANAGER", "KERNELCACHE_BASE_DIR")},
        "bundled_hits": sum(e["cache_hit"] for e in bundled),
        "bundled_misses": sum(not e["cache_hit"] for e in bundled),
        "variant_misses": sum(not e["cache_hit"] for e in variants),
        "misses": sum(not e["cache_hit"] for e in events),
        "compiles": len(events),
        "bundled_seconds": first_variant - started,
        "variant_seconds": time.perf_counter() - first_variant,
        "compile_us_of_misses": [e.get("compile_us") for e in events if not e["cache_hit"]],
        "correct": correct,
    }
    out.write_text(json.dumps(report, indent=1))
    return 0


def check_outputs(testkernels) -> dict:
    import torch

    torch.manual_seed(0)
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    testkernels.add_kernel[(4,)](x, y, out, 4096, BLOCK=1024)
    scaled = torch.empty_like(x)
    testkernels.scale_kernel[(4,)](x, scaled, 4096, 0.5, BLOCK=1024, SQUARE=True)
    logits = torch.randn((2, 32000), device="cuda")
    row_max = torch.empty(2, device="cuda")
    testkernels.row_max_kernel[(2,)](logits, row_max, logits.stride(0), 32000, BLOCK=1024, num_warps=4)
    peaked = logits.clone()
    peaked[0, 123], peaked[1, 31999] = 1e4, 1e4
    idx = torch.empty(2, dtype=torch.int32, device="cuda")
    testkernels.gumbel_argmax_kernel[(2,)](peaked, idx, peaked.stride(0), 32000, 1234, BLOCK=1024, num_warps=4)
    torch.cuda.synchronize()
    return {
        "add": torch.allclose(out, x + y),
        "scale_square": torch.allclose(scaled, (x * 0.5) ** 2),
        "row_max": torch.allclose(row_max, logits.max(dim=1).values),
        "gumbel_argmax": idx.tolist() == [123, 31999],
    }


# -- helpers --------------------------------------------------------------------------------------


def worker(work: Path, cache: Path, capability: int, fake: bool, tasks: list[dict], prefix=(), check=True):
    work.mkdir(parents=True, exist_ok=True)
    job = {"cache_dir": str(cache), "compile_log": str(work / "compiles.jsonl"), "capability": capability,
           "sm_count": 132, "mode": "cross" if fake else "native", "tasks": tasks}
    (work / "job.json").write_text(json.dumps(job))
    done = subprocess.run([*prefix, sys.executable, "-m", "kernelcache.exercise.worker", str(work / "job.json")],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
    result_path = work / "job.json.result"
    result = json.loads(result_path.read_text()) if result_path.exists() else {"ok": False, "error": done.stderr}
    if check and not result.get("ok"):
        raise RuntimeError(f"worker in {work} failed: {json.dumps(result)[-2000:]}")
    log = work / "compiles.jsonl"
    compiled = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    compiled = [r for r in compiled if r.get("event", "compile") == "compile"]  # not the gcc-build records
    return result, compiled


def kc(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "kernelcache", *args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"kernelcache {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "KERNELCACHE_"))}
    paths = [str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def make_read_only(src: Path, dst: Path) -> tuple[str, list[str]]:
    """Returns (how, command prefix for processes that must see it read-only)."""
    dst.mkdir(parents=True, exist_ok=True)
    if _sh("mount", "--bind", str(src), str(dst)) and _sh("mount", "-o", "remount,ro,bind", str(dst)):
        return "read-only bind mount", []
    _sh("umount", str(dst))
    if _sh("mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", str(dst)):
        shutil.copytree(src, dst, dirs_exist_ok=True, symlinks=True)
        if _sh("mount", "-o", "remount,ro", str(dst)):
            return "read-only tmpfs holding a copy", []
        _sh("umount", str(dst))
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True)
    for path in [dst, *dst.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    if os.geteuid() != 0:
        return "write permission removed (non-root)", []
    if shutil.which("setpriv") and subprocess.run(["setpriv", "--bounding-set", DROP, "--inh-caps", DROP, "true"],
                                                  capture_output=True).returncode == 0:
        return "write permission removed, processes run without root's DAC capabilities (setpriv)", [
            "setpriv", "--bounding-set", DROP, "--inh-caps", DROP]
    return "NOT ENFORCED: root, no mount and no setpriv; only write permission bits removed", []


def write_refused(base: Path, prefix: list[str]) -> bool:
    probe = [*prefix, sys.executable, "-c", f"open({str(base / 'probe')!r}, 'w')"]
    return subprocess.run(probe, capture_output=True).returncode != 0


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


def cleanup(dst: Path) -> None:
    """Undo every mount stacked on ``dst`` (a bind mount, or a tmpfs), so nothing outlives the run."""
    for _ in range(4):  # os.path.ismount misses a bind mount of the same filesystem: ask the kernel
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            if not any(line.split()[1] == str(dst) for line in mounts):
                return
        _sh("umount", "-l", str(dst))


def _sh(*cmd: str) -> bool:
    try:
        return subprocess.run(list(cmd), capture_output=True).returncode == 0
    except OSError:
        return False


def _capability() -> int:
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return major * 10 + minor


def _device(fake: bool) -> str:
    return "cpu" if fake else "cuda"


def _sync(fake: bool) -> None:
    if not fake:
        import torch

        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
