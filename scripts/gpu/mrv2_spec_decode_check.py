#!/usr/bin/env python3
"""GPU proof for the mrv2_spec_decode path: Model Runner V2's speculative decoding on real tensors, bundle vs cold.

A child process runs ``kernelcache.exercise.vllm_mrv2_spec_decode.mrv2_spec_decode`` natively: vLLM's own
RequestState, Sampler, RejectionSampler, EAGLE speculator (``propose``) on real CUDA tensors, the draft model's
forward and logits stubbed with seeded random tensors (the module docstring lists the stubs), the UVA device
view from ``fake_runner_ops.uva_view`` where vLLM's C extension is absent, and fake_ops' stand-ins for the
import-time C-op queries. It reports every Triton compile() call (disk hit or compile), the wall time of the
first drafted step (a step that verifies drafts, then proposes), of everything, and a digest of every token
the sampler and the rejection sampler returned (with their accepted counts) and every draft the speculator
proposed (torch seeded; vLLM's Gumbel sampling is seeded per request). The parent runs it twice, each in a
fresh process: ``bundle`` (the CPU-built bundle installed at a fresh path, served through ``kernelcache env``)
and ``cold`` (an empty Triton cache). Done means: bundle 0 compiles, the same digest as cold.

    python scripts/gpu/mrv2_spec_decode_check.py --bundle B.tar.zst --config '{"vocab": 128256, ...}' --out r.json
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
    from kernelcache.exercise import vllm_mrv2_spec_decode as family

    digest, drafted_steps = hashlib.sha256(), []
    original_step, original_propose = family.step, family.propose

    def timed_step(state, dtype, indices, scheduled, drafts, grammar=False):
        mark = time.perf_counter()
        original_step(state, dtype, indices, scheduled, drafts, grammar)
        torch.cuda.synchronize()
        if any(drafts):
            drafted_steps.append(time.perf_counter() - mark)

    def recorded_propose(state, batch, hidden, output):  # digest what was sampled, accepted and drafted
        digest.update(output.sampled_token_ids.cpu().numpy().tobytes())
        digest.update(output.num_sampled.cpu().numpy().tobytes())
        original_propose(state, batch, hidden, output)
        digest.update(state.req_states.draft_tokens[batch.idx_mapping].cpu().numpy().tobytes())

    family.step, family.propose = timed_step, recorded_propose
    started = time.perf_counter()
    summary = family.mrv2_spec_decode(**config)
    torch.cuda.synchronize()
    total = time.perf_counter() - started
    compiled = [e["name"] for e in events if not e["hit"]]
    return {"summary": {k: summary[k] for k in ("calls", "layouts", "c_ops_faked", "import_fakes", "stubbed")},
            "drafted_steps": len(drafted_steps), "first_drafted_step_s": drafted_steps[0] if drafted_steps else None,
            "all_s": total, "compile_events": len(events), "compiles": len(compiled),
            "compiled": sorted(set(compiled)), "kernels": sorted({e["name"] for e in events}),
            "digest": digest.hexdigest()}


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
    parser.add_argument("--config", required=True, help="mrv2_spec_decode() keyword arguments, as JSON")
    parser.add_argument("--modes", default="bundle,cold")
    parser.add_argument("--out", default="mrv2-spec-decode.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.config))))
        return 0
    root = Path(tempfile.mkdtemp(prefix="kc-mrv2-spec-"))
    rows = []
    for mode in args.modes.split(","):  # written after each mode, so a run cut short keeps what it measured
        rows.append(run(mode, args.bundle, args.config, root))
        Path(args.out).write_text(json.dumps({"rows": rows, "partial": True}, indent=1))
    same = len({r.get("digest") for r in rows}) == 1 and "digest" in rows[0]
    result = {"rows": rows, "same_outputs": same, "ok": same and rows[0].get("compiles") == 0}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
