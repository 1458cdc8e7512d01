"""Benchmark: a build from a serve command equals a build from kernelcache's own planning given vLLM's values.

For each model: (a) ``kernelcache build … -- vllm serve HUB_ID`` (no extra flag: every value is vLLM's), (b) the
same paths from a recipe with the model's ``[model]`` table and a ``[vllm]`` table holding the values vLLM derived
for (a) (kernelcache's planning, no vLLM config), then the member digests of both bundles are compared and (a) is
verified on the CPU (``kernelcache verify``). Results go to stdout as JSON lines; BENCHMARKS.md records them.

    python scripts/serve_equality.py [--out DIR] [--only NAME ...]

Run it in the serving venv (.venv); it builds with the default build cache, so (b) reuses (a)'s kernels.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "kernelcache" / "recipes" / "models" / "configs"
MODELS = {  # name: (hub id, its config.json, the paths both builds take)
    "Llama-3.1-8B-Instruct": ("meta-llama/Llama-3.1-8B-Instruct", CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.json",
                              ("mrv2", "runner")),
    "Mistral-7B-Instruct-v0.3": ("mistralai/Mistral-7B-Instruct-v0.3",
                                 ROOT / "tests/data/models/Mistral-7B-Instruct-v0.3/config.json", ("mrv2", "runner")),
    "Qwen3-30B-A3B": ("Qwen/Qwen3-30B-A3B", CONFIGS / "Qwen--Qwen3-30B-A3B.json", ("mrv2", "runner", "moe")),
    "Qwen3-Next-80B-A3B-Instruct": ("Qwen/Qwen3-Next-80B-A3B-Instruct",
                                    CONFIGS / "Qwen--Qwen3-Next-80B-A3B-Instruct.json",
                                    ("mrv2", "runner", "moe", "gdn")),
}
VLLM_KEYS = ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "tensor_parallel_size", "block_size",
             "kv_cache_dtype", "gdn_prefill_backend")


def kc(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"kernelcache {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return done


def digests(bundle: Path) -> dict[str, str]:
    from kernelcache.format.archive import read_manifest

    return {f.path: f.sha256 for f in read_manifest(bundle).files()}


def recipe_for(name: str, config: Path, plan: dict, paths: tuple[str, ...], out: Path) -> Path:
    """Kernelcache's own planning: the model's [model] table and vLLM's derived values as [vllm]."""
    from kernelcache.plan.model import recipe_keys

    fields = json.loads(config.read_text())
    keys = recipe_keys() - {"name"}
    lines = [f'name = "{plan["name"]}"', 'gpus = ["h100-sxm"]', "", "[vllm]", f"paths = {json.dumps(list(paths))}",
             f"logits_dtypes = {json.dumps(plan['dtypes'])}"]
    lines += [f"{k} = {json.dumps(plan[k])}" for k in VLLM_KEYS]
    lines += ["", "[model]"] + [f"{k} = {json.dumps(v)}" for k, v in fields.items() if k in keys and v is not None]
    file = out / f"{name}.toml"
    file.write_text("\n".join(lines) + "\n")
    return file


def one(name: str, out: Path) -> dict:
    hub, config, paths = MODELS[name]
    flags = ["--arch", "sm_90", "--gpu", "h100-sxm", *(w for p in paths for w in ("--path", p))]
    started = time.monotonic()
    kc("build", *flags, "--model-config", str(config), "-o", str(out / "serve"), "--", "vllm", "serve", hub)
    served_seconds = time.monotonic() - started
    [served] = (out / "serve").glob(f"*{name}*-sm_90-h100-sxm.tar.zst") or (out / "serve").glob("*.tar.zst")
    from kernelcache.format.archive import read_manifest

    plan = read_manifest(served).build.plan
    recipe = recipe_for(name, config, plan, paths, out)
    kc("build", "--arch", "sm_90", "--recipe", str(recipe), "-o", str(out / "flags"))
    [flagged] = (out / "flags").glob("*.tar.zst")
    a, b = digests(served), digests(flagged)
    verified = kc("verify", str(served), "--json")
    report = json.loads(verified.stdout)
    return {"model": name, "command": plan["serve"]["command"], "config_hash": plan["serve"]["config_hash"],
            "derived": {k: plan[k] for k in VLLM_KEYS}, "paths": list(paths), "members": len(a),
            "equal": a == b, "only_serve": sorted(set(a) - set(b))[:5], "only_flags": sorted(set(b) - set(a))[:5],
            "verify_compiles": report.get("compiles"), "verify_hits": report.get("hits"),
            "serve_build_seconds": round(served_seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/serve-equality"))
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    for name in args.only:
        work = args.out / name
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(one(name, work)), flush=True)


if __name__ == "__main__":
    main()
