#!/usr/bin/env python3
"""On a CUDA machine: FlashInfer's sampling module from a kernelcache bundle, JIT disabled, no nvcc.

What it does, from the repo root, with what scripts/pack_flashinfer_carry.sh left in .carry/flashinfer/:

1. unpacks ``site.tar.xz`` (a stripped flashinfer-python, apache-tvm-ffi and kernelcache's own
   dependencies, for the Python it was packed for) into a temp dir, appended to sys.path so that
   the machine's own packages (torch, numpy, ...) win;
2. ``kernelcache install`` the bundle (GPU check on) and ``kernelcache env``: the variables the loader sets;
3. in fresh processes with exactly those variables, no CUDA_HOME, nvcc-free PATH and a tripwire
   ``nvcc``/``ninja`` first on PATH: vLLM 0.33's ``flashinfer_sample`` call shapes through FlashInfer's
   Python API (k only: top_k_sampling_from_probs; p only: top_p_sampling_from_probs; both:
   top_k_top_p_sampling_from_logits; deterministic=True, k int32, p fp32, fp32 logits, vocab
   128256 and 151936), checking that every sample lies in the top-k / nucleus, that the empirical
   distribution matches the renormalised one, that seeded reruns repeat, counting JIT builds, and
   timing the module load and the calls.

Writes ``$OUT/flashinfer_gpu_check.json`` (``./out`` without OUT) and exits 1 if any check failed.
Needs only the standard library here; torch and triton are the machine's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CARRY = REPO / ".carry" / "flashinfer"

KERNELCACHE = """
import sys
sys.path.append(sys.argv.pop(1))
from kernelcache.cli import main
sys.argv[0] = "kernelcache"
main()
"""

PROBE = r"""
import json, os, statistics, sys, time
cfg = json.loads(sys.argv[1])
sys.path.append(cfg["site"])
out = {"python": sys.version.split()[0], "checks": {}}
t = time.perf_counter()
import torch
out["import_torch_s"] = time.perf_counter() - t
torch.cuda.init()
props = torch.cuda.get_device_properties(0)
out["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
              "torch": torch.__version__, "torch_cuda": torch.version.cuda}
t = time.perf_counter()
import flashinfer
import flashinfer.sampling as fs
from flashinfer.jit import core
from flashinfer.jit import env as jit_env
out["import_flashinfer_s"] = time.perf_counter() - t
out["flashinfer"] = flashinfer.__version__
out["flashinfer_file"] = flashinfer.__file__
out["providers"] = [{"id": p.provider_id, "dir": str(p.jit_cache_dir), "archs": sorted(p.cuda_architectures)}
                    for p in jit_env.FLASHINFER_AOT_PROVIDERS]
builds, loads = [], []
real_build, real_load = core.JitSpecNvcc.build, core.JitSpec.build_and_load
def counted_build(self, *a, **k):
    builds.append(self.name)
    return real_build(self, *a, **k)
def counted_load(self, *a, **k):
    loads.append(self.name)
    return real_load(self, *a, **k)
core.JitSpecNvcc.build, core.JitSpec.build_and_load = counted_build, counted_load

t = time.perf_counter()
fs.get_sampling_module()
out["module_load_s"] = time.perf_counter() - t
from flashinfer.jit.sampling import gen_sampling_module
out["module_paths"] = [str(a.path) for a in gen_sampling_module().aot_artifacts]

def flashinfer_sample(logits, k, p):
    # vllm/v1/sample/ops/topk_topp_sampler.py (0.33.0) flashinfer_sample, verbatim in its calls
    if k is None:
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        return fs.top_p_sampling_from_probs(probs, p, deterministic=True).view(-1)
    if p is None:
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        return fs.top_k_sampling_from_probs(probs, k, deterministic=True).view(-1)
    return fs.top_k_top_p_sampling_from_logits(logits, k, p, deterministic=True).view(-1)

def allowed(logits, k, p):
    # The set each row may sample from and its renormalised distribution, as FlashInfer defines it:
    # k only: top-k of the fp32 probs it is given; both: top-k of the logits, then the nucleus.
    # Ties and fp32 rounding at the border are allowed (1e-4 relative), not far-away tokens.
    probs32 = logits.softmax(dim=-1, dtype=torch.float32)
    probs = probs32.double()
    keep = torch.ones_like(probs, dtype=torch.bool)
    if k is not None:
        ranked = probs32 if p is None else logits
        kth = torch.sort(ranked, dim=-1, descending=True).values.gather(1, (k.long() - 1).unsqueeze(1))
        keep &= ranked >= kth
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    if p is not None:
        ordered = torch.sort(probs, dim=-1, descending=True).values
        above = ordered.cumsum(-1) - ordered  # mass of the entries ranked above each one
        inside = above < p.double().unsqueeze(1) * (1 + 1e-4)
        threshold = torch.where(inside, ordered, torch.full_like(ordered, 2.0)).min(-1, keepdim=True).values
        keep &= probs >= threshold * (1 - 1e-4)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(-1, keepdim=True)
    return keep, probs


def timed(fn, n=50):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)

gen = torch.Generator(device="cuda").manual_seed(1234)
for vocab in cfg["vocabs"]:
    batch = cfg["batch"]
    logits = torch.randn(batch, vocab, device="cuda", generator=gen) * 2.0
    k = torch.randint(1, 2048, (batch,), device="cuda", dtype=torch.int32, generator=gen)
    k[0], k[1] = 1, vocab - 1            # k=1 (greedy-like) and vLLM's dummy-run k=vocab-1
    p = torch.rand(batch, device="cuda", generator=gen) * 0.49 + 0.5
    p[2] = 0.9                           # vLLM's dummy-run p
    for mode, kk, pp in (("k", k, None), ("p", None, p), ("kp", k, p)):
        name = f"{mode}@{vocab}"
        keep, _ = allowed(logits, kk, pp)
        torch.cuda.synchronize()
        t = time.perf_counter()
        first = flashinfer_sample(logits, kk, pp)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t
        inside = bad = 0
        for _ in range(cfg["repeats"]):
            s = flashinfer_sample(logits, kk, pp)
            ok = keep.gather(1, s.long().unsqueeze(1)).squeeze(1)
            inside += int(ok.sum())
            bad += int((~ok).sum())
        torch.manual_seed(7)
        a = flashinfer_sample(logits, kk, pp)
        torch.manual_seed(7)
        b = flashinfer_sample(logits, kk, pp)
        # distribution: one row (moderately peaked) repeated, empirical vs renormalised support
        row = torch.randn(1, vocab, device="cuda", generator=gen)
        row[0, :40] += 12.0              # ~98% of the mass on 40 tokens: support of 15-35 after k=25 / p=0.8
        rows = row.expand(cfg["dist_batch"], vocab).contiguous()
        rk = torch.full((cfg["dist_batch"],), 25, device="cuda", dtype=torch.int32) if kk is not None else None
        rp = torch.full((cfg["dist_batch"],), 0.8, device="cuda", dtype=torch.float32) if pp is not None else None
        rkeep, rprobs = allowed(rows[:1], None if rk is None else rk[:1], None if rp is None else rp[:1])
        counts = torch.zeros(vocab, device="cuda", dtype=torch.float64)
        outside = 0
        for _ in range(cfg["dist_repeats"]):
            s = flashinfer_sample(rows, rk, rp).long()
            counts += torch.bincount(s, minlength=vocab).double()
            outside += int((~rkeep[0][s]).sum())
        empirical = counts / counts.sum()
        tv = float(0.5 * (empirical - rprobs[0]).abs().sum())
        median_s = timed(lambda: flashinfer_sample(logits, kk, pp))
        out["checks"][name] = {
            "batch": batch, "samples": inside + bad, "outside_allowed_set": bad,
            "seeded_rerun_equal": bool(torch.equal(a, b)), "first_call_s": first_s, "median_call_s": median_s,
            "dist_samples": int(counts.sum()), "dist_support": int(rkeep.sum()), "dist_outside": outside,
            "dist_total_variation": tv,
            "first_sample_in_range": bool(0 <= int(first.min()) and int(first.max()) < vocab),
        }
out["jit_builds"] = builds
out["specs_loaded"] = sorted(set(loads))
out["jit_dir"] = str(jit_env.FLASHINFER_JIT_DIR)
out["jit_dir_sampling_exists"] = (jit_env.FLASHINFER_JIT_DIR / "sampling").exists()
print(json.dumps(out))
"""


def main() -> int:
    out_dir = Path(os.environ.get("OUT") or REPO / "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kc-fi-check-"))
    try:
        return check(work, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check(work: Path, out_dir: Path) -> int:
    site = work / "site"
    started = time.perf_counter()
    with tarfile.open(CARRY / "site.tar.xz") as tar:
        tar.extractall(site, filter="data")
    report = {"unpack_s": time.perf_counter() - started, "bundle": str(CARRY / "fi-sm_90.tar.zst")}
    env, removed = clean_env(work)
    report["path_dirs_with_nvcc_removed"] = removed
    cache = work / "cache"

    def kc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", KERNELCACHE, str(site), *args], env=env, capture_output=True,
                              text=True)

    started = time.perf_counter()
    done = kc("install", str(CARRY / "fi-sm_90.tar.zst"), "--cache-dir", str(cache), "--json")
    report["install_s"] = time.perf_counter() - started
    if done.returncode != 0:
        return finish(out_dir, report, f"kernelcache install failed: {done.stderr.strip()}")
    report["install"] = json.loads(done.stdout)
    started = time.perf_counter()
    done = kc("env", "--cache-dir", str(cache), "--json")
    report["env_s"] = time.perf_counter() - started
    if done.returncode != 0:
        return finish(out_dir, report, f"kernelcache env failed: {done.stderr.strip()}")
    variables = json.loads(done.stdout)
    report["kernelcache_env"] = variables
    report["so_bytes"] = sum(p.stat().st_size for p in (cache / "flashinfer").rglob("*.so"))
    probe_env = {**env, **variables}
    probe_env.setdefault("FLASHINFER_WORKSPACE_BASE", str(work / "workspace"))
    config = {"site": str(site), "vocabs": [128256, 151936], "batch": 64, "repeats": 20, "dist_batch": 2048,
              "dist_repeats": 10}
    runs = []
    for _ in range(2):  # two fresh processes: the second shows the load with a warm page cache
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(config)], env=probe_env,
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            report["runs"] = runs
            return finish(out_dir, report, f"probe failed: {done.stderr.strip()[-4000:]}")
        run = json.loads(done.stdout.strip().splitlines()[-1])
        run["process_s"] = time.perf_counter() - started
        runs.append(run)
    report["runs"] = runs
    calls = work / "tripwire" / "calls.log"
    report["tripwire_calls"] = calls.read_text().splitlines() if calls.exists() else []
    return finish(out_dir, report, None)


def clean_env(work: Path) -> tuple[dict[str, str], list[str]]:
    """This environment minus CUDA_HOME, FlashInfer settings and nvcc; a tripwire nvcc/ninja first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLASHINFER_", "KERNELCACHE_", "TRITON_")) and k not in ("CUDA_HOME", "CUDA_PATH")}
    wire = work / "tripwire"
    wire.mkdir()
    for tool in ("nvcc", "ninja"):
        script = wire / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {wire / "calls.log"}\nexit 1\n')
        script.chmod(0o755)
    dirs = [d for d in env.get("PATH", "").split(os.pathsep) if d]
    removed = [d for d in dirs if (Path(d) / "nvcc").exists()]
    env["PATH"] = os.pathsep.join([str(wire), *(d for d in dirs if d not in removed)])
    env["PYTHONPATH"] = str(REPO)
    return env, removed


def verdict(report: dict) -> list[str]:
    failures = []
    for i, run in enumerate(report.get("runs", [])):
        if run["jit_builds"]:
            failures.append(f"run {i}: JIT builds {run['jit_builds']}")
        if run["jit_dir_sampling_exists"]:
            failures.append(f"run {i}: FlashInfer wrote a JIT build dir for sampling")
        if not run["module_paths"] or not all(p.startswith(str(Path(report["install"]["cache_dir"])))
                                              for p in run["module_paths"]):
            failures.append(f"run {i}: sampling resolved to {run['module_paths']}, not the installed bundle")
        for name, check in run["checks"].items():
            if check["outside_allowed_set"] or check["dist_outside"] or not check["first_sample_in_range"]:
                failures.append(f"run {i} {name}: samples outside the top-k/nucleus")
            if not check["seeded_rerun_equal"]:
                failures.append(f"run {i} {name}: seeded reruns differ")
            if check["dist_total_variation"] > 0.05:
                failures.append(f"run {i} {name}: total variation {check['dist_total_variation']:.3f} > 0.05")
    if report.get("tripwire_calls"):
        failures.append(f"something ran nvcc/ninja: {report['tripwire_calls'][:3]}")
    if report.get("kernelcache_env", {}).get("FLASHINFER_DISABLE_JIT") != "1":
        failures.append("kernelcache env did not set FLASHINFER_DISABLE_JIT=1")
    return failures


def finish(out_dir: Path, report: dict, error: str | None) -> int:
    failures = [error] if error else verdict(report)
    report["failures"] = failures
    report["ok"] = not failures
    path = out_dir / "flashinfer_gpu_check.json"
    path.write_text(json.dumps(report, indent=1))
    summary = {k: report.get(k) for k in ("ok", "failures", "install_s", "so_bytes")}
    for i, run in enumerate(report.get("runs", [])):
        summary[f"run{i}"] = {"module_load_s": run["module_load_s"], "import_flashinfer_s": run["import_flashinfer_s"],
                              "jit_builds": len(run["jit_builds"]), "gpu": run["gpu"],
                              "calls": {n: (c["first_call_s"], c["median_call_s"], c["dist_total_variation"])
                                        for n, c in run["checks"].items()}}
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")
    if shutil.which("nvidia-smi"):
        subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
