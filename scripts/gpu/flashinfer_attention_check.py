#!/usr/bin/env python3
"""The FLASHINFER attention proof on a GPU: vLLM's FlashInfer backend on real tensors, from a bundle or from nvcc.

One fresh process per run (``run``). ``--mode bundle``: ``kernelcache.activate(cache_dir=...)`` before anything
imports FlashInfer or Triton (FlashInfer's jit-cache providers, ``FLASHINFER_DISABLE_JIT=1``, Triton's cache);
``--mode jit``: an empty Triton cache and an empty FlashInfer workspace (``FLASHINFER_WORKSPACE_BASE``), so
FlashInfer builds each module with the machine's nvcc. Every nvcc process is counted through
``FLASHINFER_NVCC`` (a wrapper that logs, then runs the real nvcc), every Triton ``compile()`` call and gcc
launcher build through kernelcache's listener. The layer, KV cache, buffers and builder are the ones
kernelcache's flashinfer_attention task builds (exercise/vllm_flashinfer.py: ``Attention`` with
``FlashInferBackend``, ``FlashInferMetadataBuilder``), on vLLM's real CUDA platform; each step is the builder
(``plan()``) then ``Attention.forward`` (``run()``), recorded by the task's ``recording`` (FlashInfer builds and
loads for real). vLLM's artifactory check answers ``--cubins`` (XQA decode on SM90 needs no download, vLLM only
gates it on that check). The KV cache starts from seeded random values and each step's q/k/v come from a seeded
CUDA generator, so two runs compute the same thing; outputs are saved for ``compare``, and every non-capture step
is checked against a dense fp32 attention (scripts/gpu/checks/attention.py ``reference``).

    python scripts/gpu/flashinfer_attention_check.py run --mode bundle --cache-dir D --out R.json --outputs O.pt
    python scripts/gpu/flashinfer_attention_check.py run --mode jit --workspace W --cache-dir D ...
    python scripts/gpu/flashinfer_attention_check.py compare A.pt B.pt
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LLAMA_31_8B = {"num_heads": 32, "num_kv_heads": 8, "head_size": 128}


def batches(seqs: int, max_len: int, tokens: int) -> list[tuple[str, object]]:
    """The step list (kind, Batch), in run order: decode first (its first call loads or builds the decode module),
    then prefill, mixed and capture."""
    from kernelcache.exercise.vllm_attention import Batch

    def ctx(i: int, q: int) -> int:
        return max(q, (i * 2654435761) % max_len + 1)

    def uniform(n: int, q: int = 1, **kw) -> Batch:
        return Batch((q,) * n, tuple(ctx(i, q) for i in range(n)), **kw)

    steps = [("decode", uniform(n)) for n in (1, 2, 7, 16, 64, seqs) if n <= seqs]
    for length in (9, 100, 1000, 4096):
        if length <= min(tokens, max_len):
            steps.append(("prefill", Batch((length,), (length,))))
            steps.append(("prefill_prefix", Batch((length // 2,), (min(max_len, length + 37),))))
    for reqs in (2, 17, 64):
        chunk = min(tokens - (reqs - 1), max_len, 1024)
        if reqs <= seqs and chunk > 8:
            lens = (chunk,) + (1,) * (reqs - 1)
            steps.append(("mixed", Batch(lens, tuple(ctx(i, q) for i, q in enumerate(lens)))))
    steps += [("capture", uniform(n, capture=True)) for n in (1, 8, 64) if n <= seqs]
    return steps


def nvcc_wrapper(directory: Path, log: Path) -> Path:
    """An ``nvcc`` that appends one line per run to ``log``, then runs the real one (``$CUDA_HOME/bin/nvcc``)."""
    real = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
    directory.mkdir(parents=True, exist_ok=True)
    wrapper = directory / "nvcc"
    wrapper.write_text(f'#!/bin/sh\necho "$$ $*" | cut -c1-200 >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return wrapper


def prepare_mode(args) -> dict:
    """The environment of the run, set before FlashInfer, vLLM or Triton is imported."""
    nvcc_log = Path(args.out).with_suffix(".nvcc.log")
    nvcc_log.write_text("")
    if args.mode == "bundle":
        import kernelcache

        variables = kernelcache.activate(cache_dir=args.cache_dir)
        os.environ["FLASHINFER_WORKSPACE_BASE"] = args.workspace  # FlashInfer's log and lock files only
        return {"variables": sorted(variables), "nvcc_log": str(nvcc_log)}
    os.environ["TRITON_CACHE_DIR"] = args.cache_dir
    os.environ["FLASHINFER_WORKSPACE_BASE"] = args.workspace
    os.environ.pop("FLASHINFER_DISABLE_JIT", None)
    os.environ["FLASHINFER_NVCC"] = str(nvcc_wrapper(Path(args.workspace) / "bin", nvcc_log))
    return {"cuda_home": os.environ.get("CUDA_HOME"), "ninja": shutil.which("ninja"), "nvcc_log": str(nvcc_log)}


def run(args) -> dict:
    setup = prepare_mode(args)
    import torch

    torch.zeros(1, device="cuda")
    from kernelcache.exercise import listener

    records: list[dict] = []
    gcc = Path(args.out).with_suffix(".gcc.jsonl")
    listener.install(also=records.append)
    listener.count_builds(str(gcc))
    from kernelcache.exercise import vllm_flashinfer as vf

    substitutions = vf.prepare()
    shape = vf.rank_shape(args.num_heads, args.num_kv_heads, args.head_size, args.dtype, "auto", args.block_size,
                          args.max_num_seqs, args.max_model_len, args.max_num_batched_tokens, 0, 0.0, 1)
    recorder = vf.Recorder()
    calls, outputs, errors = [], {}, {}
    nvcc_log = Path(setup["nvcc_log"])
    with vf.artifactory(args.cubins), vf.recording(recorder, stand_in=False):
        state = vf.make_state(shape, recorder)
        state.kv_cache.normal_(generator=torch.Generator(device="cuda").manual_seed(7))
        for index, (kind, batch) in enumerate(batches(shape.max_num_seqs, shape.max_model_len,
                                                      shape.max_num_batched_tokens)):
            recorder.batch = kind
            call, out = timed_step(state, batch, index, records, nvcc_log)
            calls.append({"kind": kind, "reqs": len(batch.query_lens) + batch.pad_reqs, "tokens": batch.num_tokens,
                          **call})
            outputs[index] = out.cpu()
            if not batch.capture:
                errors[f"{index}:{kind}"] = reference(state, batch, index, out)
    torch.save(outputs, args.outputs)
    worst = max(e["max_abs"] for e in errors.values())
    firsts = {}
    for call in calls:
        firsts.setdefault(call["kind"], call["seconds"])
    return {"mode": args.mode, "setup": setup, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "flashinfer": __import__("flashinfer").__version__,
            "decode_kernel": vf.describe_decode(state.builder), "substitutions": substitutions,
            "modules": [{"name": s.name, "why": s.why, "first_batch": s.first_batch} for s in recorder.specs.values()],
            "left_out": recorder.left_out, "calls": calls, "first_call_s": calls[0]["seconds"],
            "first_call_by_kind_s": firsts, "total_s": round(sum(c["seconds"] for c in calls), 4),
            "nvcc_runs": sum(c["nvcc"] for c in calls), "compiles": sum(c["compiles"] for c in calls),
            "hits": sum(c["hits"] for c in calls), "gcc_builds": len(listener.read(str(gcc))),
            "reference": {"steps": len(errors), "worst_max_abs": worst, "tolerance": 3e-2, "ok": worst < 3e-2,
                          "per_step": errors}}


def timed_step(state, batch, index: int, records: list[dict], nvcc_log: Path):
    import torch
    from checks.attention import inputs

    from kernelcache.exercise.vllm_flashinfer import step

    tensors = inputs(state, batch, index)  # the same seeded q/k/v as the TRITON_ATTN check
    seen, nvcc_seen = len(records), _lines(nvcc_log)
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = step(state, batch, tensors)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    new = records[seen:]
    return ({"seconds": round(seconds, 4), "nvcc": _lines(nvcc_log) - nvcc_seen,
             "compiles": sum(not r["cache_hit"] for r in new), "hits": sum(bool(r["cache_hit"]) for r in new),
             "keys": sorted({r["key"] for r in new})}, out)


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


def reference(state, batch, index: int, out) -> dict:
    """scripts/gpu/checks/attention.py's dense fp32 causal attention over the cache, for this step's inputs."""
    from checks.attention import reference as dense

    return dense(state, batch, index, out)


def compare(a: str, b: str) -> dict:
    """Whether two runs' saved outputs are the same bits, step by step."""
    import torch

    left, right = torch.load(a), torch.load(b)
    per_step = {i: bool(torch.equal(left[i], right[i])) for i in left if i in right}
    return {"identical": bool(per_step) and all(per_step.values()) and left.keys() == right.keys(),
            "steps": len(per_step), "differing": [i for i, same in per_step.items() if not same]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run")
    one.add_argument("--mode", choices=("bundle", "jit"), required=True)
    one.add_argument("--cache-dir", required=True, help="bundle: the installed cache; jit: an empty Triton cache")
    one.add_argument("--workspace", required=True, help="FLASHINFER_WORKSPACE_BASE (jit: where nvcc builds)")
    one.add_argument("--out", required=True)
    one.add_argument("--outputs", required=True)
    one.add_argument("--cubins", action=argparse.BooleanOptionalAction, default=True,
                     help="answer vLLM's artifactory check (the bundle's flashinfer_cubins)")
    one.add_argument("--dtype", default="bfloat16")
    one.add_argument("--block-size", type=int, default=16)
    one.add_argument("--max-num-seqs", type=int, default=256)
    one.add_argument("--max-model-len", type=int, default=8192)
    one.add_argument("--max-num-batched-tokens", type=int, default=8192)
    for name, value in LLAMA_31_8B.items():
        one.add_argument(f"--{name.replace('_', '-')}", type=int, default=value)
    two = sub.add_parser("compare")
    two.add_argument("a")
    two.add_argument("b")
    args = parser.parse_args()
    if args.command == "run":
        result = run(args)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
        result = {**result, "reference": {k: v for k, v in result["reference"].items() if k != "per_step"}}
    else:
        result = compare(args.a, args.b)
    print(json.dumps({k: v for k, v in result.items() if k != "calls"}, indent=1, default=str)[:6000])
    return 0 if result.get("identical", result.get("reference", {}).get("ok", True)) else 1


if __name__ == "__main__":
    sys.exit(main())
