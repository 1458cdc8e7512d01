#!/usr/bin/env python3
"""GPU proof for the runner path: Model Runner V2's own kernels on real tensors, with the bundle and cold.

A child process runs ``kernelcache.exercise.vllm_runner.runner`` natively (real CUDA tensors, real UVA
buffers: vLLM's C extension is absent here, so the device view of pinned memory comes from
``fake_runner_ops.uva_view``, the same pointer the C op returns). It reports every Triton compile() call (disk
hit or compile), the wall time of the first step and of everything, and a digest of every sampled token and
logprob the sampler returned (torch and Triton RNG seeded). The parent runs it twice, each in a fresh process:
``bundle`` (the CPU-built bundle installed at a fresh path, served through ``kernelcache env``) and ``cold``
(an empty Triton cache). Done means: bundle 0 compiles, the same digest as cold.

    python scripts/gpu/runner_check.py --bundle B.tar.zst --config '{"vocab": 151936, ...}' --out runner.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(config: dict) -> dict:
    import torch
    import triton

    events = []

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        events.append({"name": src.name, "hit": bool(cache_hit)})

    triton.knobs.compilation.listener = listener
    torch.zeros(1, device="cuda")
    torch.manual_seed(0)
    from vllm.v1.worker.gpu.sample import sampler as mrv2_sampler

    digest, firsts = hashlib.sha256(), []
    original = mrv2_sampler.Sampler.__call__

    def recorded(self, logits, input_batch):  # digest every sampler output; time the first call
        mark = time.perf_counter()
        out = original(self, logits, input_batch)
        torch.cuda.synchronize()
        firsts.append(time.perf_counter() - mark)
        digest.update(out.sampled_token_ids.cpu().numpy().tobytes())
        if out.logprobs_tensors is not None:
            digest.update(out.logprobs_tensors.logprob_token_ids.cpu().numpy().tobytes())
        return out

    mrv2_sampler.Sampler.__call__ = recorded
    from kernelcache.exercise.vllm_runner import runner

    started = time.perf_counter()
    summary = runner(**config)
    torch.cuda.synchronize()
    total = time.perf_counter() - started
    compiled = [e["name"] for e in events if not e["hit"]]
    return {"summary": summary, "sampler_calls": len(firsts), "first_sampler_call_s": firsts[0] if firsts else None,
            "all_s": total, "compile_events": len(events), "compiles": len(compiled),
            "compiled": sorted(set(compiled)), "digest": digest.hexdigest()}


def run(mode: str, bundle: str, config: str, root: Path) -> dict:
    cache = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=root)) / "cache"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    if mode == "bundle":
        subprocess.run([sys.executable, "-m", "kernelcache", "install", bundle, "--cache-dir", str(cache)],
                       check=True, env=env, capture_output=True)
        found = subprocess.run([sys.executable, "-m", "kernelcache", "env", "--cache-dir", str(cache), "--json"],
                               check=True, env=env, capture_output=True, text=True)
        env.update(json.loads(found.stdout))
    done = subprocess.run([sys.executable, __file__, "--child", "--config", config], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        return {"mode": mode, "error": done.stderr[-3000:]}
    return {"mode": mode, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--bundle")
    parser.add_argument("--config", required=True, help="runner() keyword arguments, as JSON")
    parser.add_argument("--out", default="runner.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.config))))
        return 0
    root = Path(tempfile.mkdtemp(prefix="kc-runner-"))
    rows = [run(mode, args.bundle, args.config, root) for mode in ("bundle", "cold")]
    same = len({r.get("digest") for r in rows}) == 1 and "digest" in rows[0]
    result = {"rows": rows, "same_outputs": same, "ok": same and rows[0].get("compiles") == 0}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
