#!/usr/bin/env python3
"""Prove a family's CPU-built bundle on a GPU: install it at a new path, run the family's check cold and with the
bundle, each in a fresh process, compare their outputs, summarise. One driver for every family.

    python3 scripts/gpu/prove.py FAMILY [FAMILY ...] [--bundle NAME=PATH] [--recipe NAME] [--states cold,bundle]
                                 [--out DIR] [--work DIR] [--dry-run]

FAMILY is a path of the registry (kernelcache/plan/families/: ``moe``, ``mrv2``, ...) or the name of its GPU check
(``sampler`` for registry, mrv1 and mrv2). The check is ``tests/gpu_checks/<name>.py``, a test of the family's driver
on a GPU (as its key probe in tests/probes/ is one on the CPU): its public ``check(tasks, records)`` runs the
family's vLLM code on real tensors and returns its outputs (tensors by name) and what it measured. ``tasks`` are the
family's exercise tasks (plan/tasks.py) of the plan the bundle records (``--recipe``: of a shipped recipe instead),
so the check runs what the build ran.

The bundle: ``--bundle NAME=PATH`` (a file, or a folder holding one per GPU product), default ``.carry/NAME/``; in a
folder, the bundle whose name ends with the visible GPU's profile (``-h200.tar.zst``, ``-h100-sxm.tar.zst``) is
taken, else the first. States (``--states``, default ``cold,bundle``): ``cold`` (an empty Triton cache; ``cold2``
... more of them), ``bundle`` (the bundle installed with ``kernelcache install`` at a new cache dir under its own
HOME, the process served through ``kernelcache env``; each state's HOME is its own, so FlashInfer's workspace
starts empty), ``tuned`` and ``chosen`` (``State``). Each state runs
``prove.py --child`` in a fresh process: it counts every Triton ``compile()`` (a disk hit or a compile) and every
gcc launcher build with kernelcache's listener, times the check, and digests each output tensor's bytes.

The summary (``OUT/prove.json``, printed): the box (GPU, driver, Python, torch, Triton); per family and state the
counts, seconds and the check's own findings, and whether the state computed the cold state's outputs bit for
bit; ``ok`` when the bundle state compiled nothing, built nothing and matched. Every state's result, log and
compile records go to ``OUT/logs.tgz``. Both are written again after each family, and each state prints one line as
it ends, so a device call cut short by its time limit still brings back what was done (give each state its limit with
``--timeout`` rather than wrapping the driver in ``timeout``).

On the GPU box (no vLLM installed) vLLM's pure-Python tree comes from ``.carry/vllm-h200.tar.xz``
(scripts/gpu/prepare_carry.sh) and FlashInfer's package, sources and ninja from ``.carry/fi-site.tar.xz``
(scripts/gpu/prepare_flashinfer_attention_carry.sh): unpacked under the work dir and put on the children's
PYTHONPATH (and PATH) after scripts/gpu/site and this checkout. Where the box has an nvcc, ``FLASHINFER_NVCC``
is a wrapper that logs each run to the state's log: a state's ``nvcc_runs`` counts FlashInfer's JIT builds, and a
bundle state that ran nvcc is not ``ok``. ``--dry-run`` prints the bundle, the tasks and every command, runs
nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CHECKS = ROOT / "tests" / "gpu_checks"  # GPU tests of the families' drivers, beside their key probes (tests/probes/)
sys.path.insert(0, str(CHECKS))  # the checks import their siblings by name (gpu_checks/common.py)
from common import NVCC_LOG, nvcc_runs  # noqa: E402 -- found through the path just set

CARRY = ROOT / ".carry"
# vLLM's pure-Python tree (scripts/gpu/prepare_carry.sh); KERNELCACHE_VLLM_TREE names another release's
# (scripts/gpu/prepare_release_carry.sh: .carry/rel34/vllm-h200.tar.xz).
VLLM_TREE = Path(os.environ.get("KERNELCACHE_VLLM_TREE") or CARRY / "vllm-h200.tar.xz")
FLASHINFER_TREE = CARRY / "fi-site.tar.xz"  # scripts/gpu/prepare_flashinfer_attention_carry.sh
PRODUCTS = {"H200": "h200", "H100 80GB HBM3": "h100-sxm"}  # a GPU's name -> the profile its bundles are built for
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "PYTHONUNBUFFERED": "1"}


# -- what to prove ----------------------------------------------------------------------------------------------


def checks() -> dict[str, tuple[str, ...]]:
    """Every GPU check the registry names -> the paths it proves, in path order."""
    from kernelcache.plan.families import families

    found: dict[str, list[str]] = {}
    for family in families():
        if family.about.gpu_check:
            found.setdefault(family.about.gpu_check, []).append(family.name)
    return {name: tuple(paths) for name, paths in found.items()}


def resolve(names: list[str]) -> list[str]:
    """The checks that prove ``names`` (paths or check names), each once, in the order given."""
    known, chosen = checks(), []
    for name in names:
        check = name if name in known else next((c for c, paths in known.items() if name in paths), None)
        if check is None:
            raise SystemExit(f"prove: no GPU check proves {name!r} (known: {', '.join(known)} and their paths)")
        chosen += [check] if check not in chosen else []
    return chosen


def pick_bundle(spec: str | None, check: str, product: str) -> Path | None:
    """The bundle file for ``check``: ``spec`` (a file or a folder) or ``.carry/CHECK/``; None when none is there."""
    where = Path(spec) if spec else CARRY / check
    if where.is_file():
        return where
    found = sorted(where.glob("*.tar.zst")) if where.is_dir() else []
    mine = [b for b in found if product and b.name.endswith(f"-{product}.tar.zst")]
    return (mine or found or [None])[0]


def plan_of(bundle: Path | None, recipe: str | None):
    """The build plan: a shipped recipe's (``--recipe``), else the one the bundle records."""
    from kernelcache.format.archive import read_manifest
    from kernelcache.plan.recipe import BuildPlan, load

    if recipe or bundle is None:
        return load(recipe)
    recorded = read_manifest(bundle).build.plan
    if not recorded or "merged_from" in recorded:
        raise SystemExit(f"prove: {bundle} records no single build plan (packed or merged); pass --recipe")
    return BuildPlan.from_dict(recorded)


def tasks_for(check: str, plan) -> list[dict]:
    """The plan's exercise tasks of the families ``check`` proves: the first vocab size's, then the model's."""
    from kernelcache.plan.tasks import plan_units

    paths = checks()[check]
    units = plan_units(plan)
    chosen = [units[0]] if units and units[0][0] != "model" else []
    chosen += [u for u in units if u[0] == "model"]
    return [asdict(task) for _, tasks in chosen for task in tasks if task.label in paths]


# -- the states -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """One fresh process of a family's check, and what to do first: ``cold`` (and ``cold2`` ...: an empty cache),
    ``bundle`` (the bundle installed, the process served), ``tuned`` (the bundle tuned on this GPU with ``kernelcache
    tune``, or ``--tuned``'s file, installed and served), ``chosen`` (an empty cache seeded with the tuned bundle's
    autotune choices alone: scripts/gpu/seed_choices.py; it compiles everything and must compute what ``tuned``
    serves)."""

    name: str
    cache: Path
    home: Path
    prepare: tuple[tuple[str, ...], ...] = ()
    served: bool = False


STATES = ("cold", "bundle", "tuned", "chosen")


def states(names: list[str], check: str, bundle: Path | None, tuned: Path | None, work: Path) -> list[State]:
    """The states ``names`` asks for, in that order (``cold`` + digits: more cold processes)."""
    root, python = work / check, sys.executable
    tuned = tuned or root / "tuned.tar.zst"
    kc = (python, "-m", "kernelcache")
    chosen = []
    for name in names:
        cache, home = root / name / "cache", root / name / "home"
        if name.rstrip("0123456789") == "cold" or name not in STATES:
            prepare: tuple = ()
        elif name == "bundle":
            prepare = ((*kc, "install", str(bundle), "--cache-dir", str(cache)),)
        elif name == "tuned":
            tune = () if tuned.is_file() else ((*kc, "tune", str(bundle), "-o", str(tuned)),)
            prepare = (*tune, (*kc, "install", str(tuned), "--cache-dir", str(cache)))
        else:
            prepare = ((python, str(ROOT / "scripts/gpu/seed_choices.py"), str(tuned), str(cache)),)
        chosen.append(State(name, cache, home, prepare, name in ("bundle", "tuned")))
    unknown = [n for n in names if n.rstrip("0123456789") != "cold" and n not in STATES]
    if unknown:
        known = ", ".join(STATES[1:])
        raise SystemExit(f"prove: unknown state(s) {', '.join(unknown)} (known: cold, cold2 ..., {known})")
    return chosen


def child_command(check: str, tasks: list[dict], result: Path) -> list[str]:
    return [sys.executable, str(Path(__file__)), "--child", check, "--tasks", json.dumps(tasks), "--result",
            str(result)]


def run_state(state: State, check: str, tasks: list[dict], out: Path, base_env: dict, timeout: int) -> dict:
    """What the state prepares (install, tune, seed), then the check in a fresh process; the child's result or
    what failed. Its result, logs and compile records go to ``out`` (the work dir's logs/)."""
    result = out / f"{check}-{state.name}.json"
    state.cache.mkdir(parents=True, exist_ok=True)
    state.home.mkdir(parents=True, exist_ok=True)
    env = {**base_env, "HOME": str(state.home), "TRITON_CACHE_DIR": str(state.cache),
           NVCC_LOG: str(out / f"{check}-{state.name}.nvcc.log")}
    for command in state.prepare:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        with (out / f"{check}-{state.name}-prepare.txt").open("a") as log:
            log.write(f"$ {shlex.join(command)}\n{done.stdout}{done.stderr}exit {done.returncode}\n")
        if done.returncode:
            return {"error": f"{command[2] if command[1] == '-m' else Path(command[1]).name} exit "
                             f"{done.returncode}: {done.stderr[-1500:]}"}
    if state.served:
        env.update(served_env(state.cache, env))
    log = out / f"{check}-{state.name}.log"
    try:
        with log.open("w") as sink:
            done = subprocess.run(child_command(check, tasks, result), env=env, stdout=sink,
                                  stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s (log: {log.name})"}
    if done.returncode or not result.is_file():
        return {"error": f"exit {done.returncode}: {log.read_text()[-2500:]}"}
    return json.loads(result.read_text())


def served_env(cache: Path, env: dict) -> dict:
    """The variables ``kernelcache env`` gives a process served from ``cache``."""
    done = subprocess.run([sys.executable, "-m", "kernelcache", "env", "--cache-dir", str(cache), "--json"],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


# -- one state's process (--child) ------------------------------------------------------------------------------


def load_check(check: str):
    """``tests/gpu_checks/CHECK.py`` as a module (its siblings, gpu_checks/common.py, importable: ``CHECKS`` is on the
    path)."""
    spec = importlib.util.spec_from_file_location(f"kernelcache_check_{check}", CHECKS / f"{check}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def child(check: str, tasks: list[dict], result: Path) -> dict:
    """Run the check under kernelcache's compile listener; write its findings, counts and output digests."""
    import torch

    torch.zeros(1, device="cuda")
    from kernelcache.format.compilelog import read
    from kernelcache.hooks import kernelcache_listener

    records: list[dict] = []
    gcc = result.with_suffix(".gcc.jsonl")
    kernelcache_listener.install(also=records.append)
    kernelcache_listener.count_builds(str(gcc))
    module = load_check(check)
    started = time.perf_counter()
    found = module.check(tasks, records)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    outputs = found.pop("outputs", {})
    summary = {**found, "all_s": round(seconds, 4), "compiles": sum(not r["cache_hit"] for r in records),
               "hits": sum(bool(r["cache_hit"]) for r in records), "gcc_builds": len(read(str(gcc))),
               "nvcc_runs": nvcc_runs(),
               "compiled": sorted({r["name"] for r in records if not r["cache_hit"]}),
               "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": __import__("triton").__version__, "digests": digests(outputs)}
    result.write_text(json.dumps(summary, indent=1, default=str))
    return summary


def digests(outputs: dict) -> dict[str, str]:
    """sha256 of each output's bytes (its dtype and shape included): equal digests, bit-identical outputs."""
    found = {}
    for name, tensor in outputs.items():
        flat = tensor.detach().contiguous().cpu().reshape(-1)
        data = flat.view(__import__("torch").uint8).numpy().tobytes() if flat.numel() else b""
        found[str(name)] = hashlib.sha256(f"{flat.dtype}{tuple(tensor.shape)}".encode() + data).hexdigest()
    return found


# -- the summary ------------------------------------------------------------------------------------------------


def compare(reference: dict, other: dict) -> dict:
    """Whether ``other`` computed ``reference``'s outputs bit for bit, output by output."""
    left, right = reference.get("digests") or {}, other.get("digests") or {}
    differing = sorted(k for k in left if k in right and right[k] != left[k])
    missing = sorted(set(left) ^ set(right))
    return {"identical": bool(left) and not differing and not missing, "outputs": len(left), "differing": differing,
            "missing": missing}


def summarise(check: str, runs: dict[str, dict], bundle: Path | None) -> dict:
    """One family's verdict: per state the counts and its outputs against the cold state's (and the tuned state's
    against the chosen one's); ``ok`` when the bundle state (and a tuned one) compiled nothing, built nothing and
    computed the cold state's outputs (a tuned one: the chosen state's)."""
    rows = {name: {k: v for k, v in run.items() if k != "digests"} for name, run in runs.items()}
    for name, run in runs.items():
        against = "chosen" if name == "tuned" and "chosen" in runs else "cold"
        if name not in (against, "cold") and against in runs and "error" not in run and "error" not in runs[against]:
            rows[name][f"outputs_vs_{against}"] = compare(runs[against], run)
    ok = all(served_ok(runs[name], rows[name]) for name in ("bundle", "tuned") if name in runs)
    return {"check": check, "bundle": str(bundle) if bundle else None, "ok": ok and bool(runs), **rows}


def served_ok(run: dict, row: dict) -> bool:
    matched = [v["identical"] for k, v in row.items() if k.startswith("outputs_vs_")]
    return "error" not in run and run.get("compiles") == 0 and run.get("gcc_builds") == 0 and \
        not run.get("nvcc_runs") and matched == [True]


# -- the box ----------------------------------------------------------------------------------------------------


@dataclass
class Box:
    """The GPU box's Python environment for the children: this checkout, vLLM's and FlashInfer's carried trees when
    it has none of its own, and ``FLASHINFER_NVCC``: a wrapper that logs each nvcc run to the state's log, then
    runs the box's nvcc (a cold state's FlashInfer builds its modules with it)."""

    work: Path
    product: str = ""
    env: dict = field(default_factory=dict)
    description: str = ""

    def prepare(self, dry: bool) -> None:
        self.product = PRODUCTS.get(next((k for k in PRODUCTS if k in gpu_name()), ""), "")
        paths, bins = [str(ROOT / "scripts" / "gpu" / "site"), str(ROOT)], []
        if importlib.util.find_spec("flashinfer") is None and FLASHINFER_TREE.is_file():
            tree = unpack(FLASHINFER_TREE, self.work / "fi", dry)
            paths.append(str(tree / "site"))
            bins.append(str(tree / "bin"))  # ninja
        if importlib.util.find_spec("vllm") is None and VLLM_TREE.is_file():
            tree = unpack(VLLM_TREE, self.work / "vx", dry)
            paths += [str(tree / "site"), str(tree / "vllm")]
            sys.path.append(str(tree / "site"))  # this process reads bundles too (zstandard)
        path = os.pathsep.join([*bins, os.environ.get("PATH", "")])
        self.env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(paths), "PATH": path,
                    "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 1)), **nvcc_env(self.work, dry)}
        if not dry:
            self.description = describe_box()


def unpack(archive_path: Path, tree: Path, dry: bool) -> Path:
    if not dry:
        shutil.rmtree(tree, ignore_errors=True)
        with tarfile.open(archive_path) as archive:
            archive.extractall(tree, filter="fully_trusted")
    return tree


def nvcc_env(work: Path, dry: bool) -> dict:
    """``CUDA_HOME`` and ``FLASHINFER_NVCC`` (the logging wrapper) when the box has an nvcc; else nothing."""
    found = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    home = os.environ.get("CUDA_HOME") or (str(Path(found).resolve().parents[1]) if found else "")
    real = Path(home) / "bin" / "nvcc"
    if not home or not real.exists():
        return {}
    wrapper = work / "bin" / "nvcc"
    if not dry:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(f'#!/bin/sh\necho "$$ $*" | cut -c1-200 >> "${{{NVCC_LOG}:-/dev/null}}"\n'
                           f'exec "{real}" "$@"\n')
        wrapper.chmod(0o755)
    return {"CUDA_HOME": home, "FLASHINFER_NVCC": str(wrapper)}


def gpu_name() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else ""


def describe_box() -> str:
    versions = subprocess.run([sys.executable, "-c", "import sys, torch, triton; print(sys.version.split()[0], "
                               "torch.__version__, triton.__version__)"], capture_output=True, text=True)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    return (smi.stdout if smi else "no nvidia-smi\n") + versions.stdout + versions.stderr


# -- the command line -------------------------------------------------------------------------------------------


def prove(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or (Path(tempfile.gettempdir()) / "kc-prove" if args.dry_run
                              else tempfile.mkdtemp(prefix="kc-prove-")))
    logs = work / "logs"
    box = Box(work)
    box.prepare(args.dry_run)
    bundles, tuned = dict(named(args.bundle)), dict(named(args.tuned))
    summary = {"box": box.description, "families": {}, "ok": True}
    for check in resolve(args.families):
        bundle = pick_bundle(bundles.get(check), check, box.product)
        tasks = tasks_for(check, plan_of(bundle, args.recipe))
        chosen = states(args.states.split(","), check, bundle, Path(tuned[check]) if check in tuned else None, work)
        missing = missing_input(check, bundle, tasks, chosen)
        if args.dry_run:
            print_plan(check, bundle, tasks, chosen, logs, missing)
            continue
        if missing:
            summary["families"][check] = {"check": check, "ok": False, "error": missing}
        else:
            logs.mkdir(parents=True, exist_ok=True)
            runs = {}
            for state in chosen:
                started = time.monotonic()
                runs[state.name] = run_state(state, check, tasks, logs, box.env, args.timeout)
                said = runs[state.name].get("error", "done")
                print(f"# {check} {state.name}: {said.splitlines()[0][:200] if said else ''} "
                      f"({time.monotonic() - started:.0f} s)", flush=True)
            summary["families"][check] = summarise(check, runs, bundle)
        summary["ok"] = summary["ok"] and summary["families"][check]["ok"]
        keep(summary, out, logs)  # a device call cut short by its limit still brings back the families done
    return summary


def keep(summary: dict, out: Path, logs: Path) -> None:
    """The summary so far as ``out/prove.json``, and the logs in one archive (a device call brings back few
    files)."""
    (out / "prove.json").write_text(json.dumps(summary, indent=1, default=str))
    if logs.is_dir():
        with tarfile.open(out / "logs.tgz", "w:gz") as archive:
            archive.add(logs, arcname="logs")


def missing_input(check: str, bundle: Path | None, tasks: list[dict], chosen: list[State]) -> str:
    """Why the check cannot run ("" when it can): no bundle for a state that installs one, no task in the plan."""
    if bundle is None and any(s.name in ("bundle", "tuned") for s in chosen):
        return f"no bundle: none under .carry/{check}/ (--bundle {check}=PATH)"
    if not tasks:
        return f"the plan has no task of {', '.join(checks()[check])}: nothing to check"
    return ""


def named(items: list[str]) -> list[tuple[str, str]]:
    """``NAME=PATH`` items, NAME resolved to its check."""
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (_, sep, path) in zip(items, pairs) if not sep or not path]
    if bad:
        raise SystemExit(f"prove: expected NAME=PATH, got {', '.join(bad)}")
    return [(resolve([name])[0], path) for name, _, path in pairs]


def print_plan(check: str, bundle: Path | None, tasks: list[dict], chosen: list[State], out: Path,
               missing: str) -> None:
    print(f"# {check}: proves {', '.join(checks()[check])}; bundle {bundle or '(none found)'}")
    if missing:
        print(f"# {check}: skipped: {missing}")
        return
    for task in tasks:
        print(f"#   task {task['label']}: {task['call']} {json.dumps(task['kwargs'], sort_keys=True)}")
    for state in chosen:
        where = f"[{state.name}] HOME={state.home} TRITON_CACHE_DIR={state.cache}"
        for command in state.prepare:
            print(f"{where} {shlex.join(command)}")
        served = " (+ the variables of kernelcache env)" if state.served else ""
        print(f"{where}{served} {shlex.join(child_command(check, tasks, out / f'{check}-{state.name}.json'))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="registry paths or check names (tests/gpu_checks/)")
    parser.add_argument("--bundle", action="append", default=[], metavar="NAME=PATH",
                        help="the bundle (file or folder) of check NAME [default: .carry/NAME/]")
    parser.add_argument("--tuned", action="append", default=[], metavar="NAME=PATH",
                        help="a tuned bundle for the tuned and chosen states [default: kernelcache tune here]")
    parser.add_argument("--recipe", help="take the tasks from this recipe's plan, not the bundle's")
    parser.add_argument("--states", default="cold,bundle", help="cold, cold2 ..., bundle, tuned, chosen")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    parser.add_argument("--work", help="where the caches, homes and vLLM's tree go [default: a new temp dir]")
    parser.add_argument("--timeout", type=int, default=540, help="seconds per state's process")
    parser.add_argument("--dry-run", action="store_true", help="print what would run; run nothing")
    parser.add_argument("--print-tasks", action="store_true", help="print the tasks a check gets, as JSON; run nothing")
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                        help="whether two results of --child computed the same outputs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--tasks", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, json.loads(args.tasks), Path(args.result))
        return 0
    if args.compare:
        found = compare(*(json.loads(Path(f).read_text()) for f in args.compare))
        print(json.dumps(found, indent=1))
        return 0 if found["identical"] else 1
    if not args.families:
        parser.error(f"name a family: {', '.join(checks())}")
    if args.print_tasks:
        (check,) = resolve(args.families[:1])
        bundle = pick_bundle(dict(named(args.bundle)).get(check), check, "")
        print(json.dumps(tasks_for(check, plan_of(bundle, args.recipe))))
        return 0
    summary = prove(args)
    if args.dry_run:
        return 0
    text = json.dumps(summary, indent=1, default=str)
    print(text[:12000])
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
