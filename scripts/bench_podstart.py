#!/usr/bin/env python3
"""What kernelcache itself costs on a pod's start path: CLI wall time of install / env / run.

    python scripts/bench_podstart.py --bundle B [--source after=. --source before=/path/to/main] [--runs 15]

Each ``--source LABEL=DIR`` is a kernelcache tree run as ``python -m kernelcache`` with
``PYTHONPATH=DIR`` (so one interpreter and one set of packages measure old and new code); each
``--venv LABEL=DIR`` a venv with kernelcache installed (a release wheel, ``pip`` or ``uv pip``), run as users run
it: its console script ``DIR/bin/kernelcache``, and ``DIR/bin/python`` for the ``python`` scenario (run this from
outside the checkout);
``LABEL=DIR@BUNDLE`` gives that tree its own copy of the bundle (a tree from before a manifest field
refuses a bundle that has it: ``scripts/strip_identity.py`` writes one without the Triton identity). Rounds
interleave the sources, so a load that changes during the run weighs on each alike. Scenarios:

* ``noop-install``: ``install B`` into a cache dir that holds B (installed once before the runs);
* ``noop-install-gpu``: ``install B --gpu G`` there, G the bundle's own GPU profile: the init container's form
  (DEPLOYING.md), where no GPU is visible;
* ``python``: ``python -c pass``, the interpreter's own start, which the no-op installs are compared with;
* ``env``: ``env --cache-dir D``;
* ``cold-install``: ``install B`` into a fresh cache dir: extraction, publishing and the first
  fingerprint (libtriton.so is in the page cache after the first run);
* ``run``, ``run-bundle``: ``run [--bundle B] --cache-dir D -- /bin/true``, reported as the time
  added to ``/bin/true`` run directly (``exec``), measured in the same rounds;
* ``unpack-floor`` (where ``zstd`` and ``tar`` are installed): ``zstd -dc B | tar -x -C D`` into a fresh
  dir, the same bytes and files as a cold install without any check: what the file system and the
  decompression alone cost on this machine, which a cold install cannot go below. Cache dirs are made
  under ``$TMPDIR``: run with ``TMPDIR`` on the file system a pod's cache dir would be on (a disk, or a
  memory-backed emptyDir such as /dev/shm).

By default the commands run under a bare venv whose one ``.pth`` line names ``--python``'s site-packages:
kernelcache comes from the source tree as it would from an installed wheel, and the packages are
``--python``'s, but that venv's own ``.pth`` files do not run (a development venv's editable install adds an
import finder that costs every Python start 15-30 ms, which no user's image has). ``--no-as-installed`` runs
``--python`` itself.

``--parts`` also times, in fresh processes, what a first fingerprint is made of: the key (stat calls),
``import triton``, ``triton_key()`` (hashing libtriton.so), the ptxas and variable lookups.

Prints, per source and scenario, the median wall time, the interquartile range and min-max, and the
median CPU time (user + sys of the process and its children), then the machine, load and versions.
The GPU probe runs as it does for users (no KERNELCACHE_NO_GPU_PROBE).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIOS = ("python", "noop-install", "noop-install-gpu", "env", "cold-install", "run", "run-bundle")
FLOOR = "unpack-floor"  # `zstd -dc B | tar -x -C D`: the same bytes and files, no checks, no Python


@functools.cache
def quiet_dir() -> str:
    """An empty directory nothing writes into while the benchmark runs."""
    return tempfile.mkdtemp(prefix="kernelcache-bench-cwd-")


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one command, which must succeed.

    It runs in an empty dir of its own: ``python -m`` puts the working directory first on sys.path, so run from
    a checkout it would import that checkout's kernelcache whatever PYTHONPATH says; and ``env`` / ``run`` take
    their kept variables only while every sys.path directory is unchanged (runtime/served.py), which the temp
    dir, where the runs create cache dirs, never is. The console script's first entry is its bin dir."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          cwd=quiet_dir())
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


class Source:
    """A kernelcache tree run with ``python -m kernelcache``, or (``venv``) a venv's installed console script."""

    def __init__(self, label: str, root: Path, python: str, bundle: Path, work: Path, path: tuple[str, ...] = (),
                 venv: bool = False):
        self.label, self.root, self.python, self.bundle, self.venv = label, root, python, bundle, venv
        self.work = work / label
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("TRITON_", "KERNELCACHE_")) and k != "PYTHONPATH"}
        if venv:
            self.python = str(root / "bin" / "python")
        else:
            self.env["PYTHONPATH"] = os.pathsep.join([str(root), *path])
        self.installed = self.work / "installed"
        self.cold = 0
        self.gpu = ""

    def kc(self, *args: str) -> list[str]:
        if self.venv:
            return [str(self.root / "bin" / "kernelcache"), *args]
        return [self.python, "-m", "kernelcache", *args]

    def prepare(self) -> None:
        # Byte-compiled as pip compiles what it installs: kernelcache's tree, and the packages it imports where
        # they were installed without .pyc files (uv's default; a box with PYTHONDONTWRITEBYTECODE=1 never writes
        # them), which would otherwise be compiled again by every command. A venv is measured as it was installed.
        if not self.venv:
            subprocess.run([self.python, "-m", "compileall", "-q", str(self.root / "kernelcache"), *self.imported()],
                           check=True, env=self.env, cwd=quiet_dir())
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        timed(self.kc("install", str(self.bundle), "--cache-dir", str(self.installed)), self.env)
        shown = subprocess.run(self.kc("inspect", "--json", str(self.bundle)), env=self.env, capture_output=True,
                               text=True, check=True, cwd=quiet_dir())
        self.gpu = json.loads(shown.stdout)["target"]["gpu"]
        timed(self.argv("noop-install-gpu"), self.env)  # its first run checks the bundle; the record answers after

    def imported(self) -> list[str]:
        """The files of the installed packages the pod-start commands import (click, filelock, zstandard...)."""
        probe = ("import sys, kernelcache.cli, kernelcache.install, kernelcache.entry, kernelcache.runtime.env\n"
                 "print('\\n'.join(m.__file__ for m in list(sys.modules.values())\n"
                 "                if getattr(m, '__file__', None) and m.__file__.endswith('.py')))")
        done = subprocess.run([self.python, "-c", probe], env=self.env, capture_output=True, text=True,
                              cwd=quiet_dir(), check=True)
        return [f for f in done.stdout.split() if "site-packages" in f or "dist-packages" in f]

    def argv(self, scenario: str) -> list[str]:
        installed = str(self.installed)
        if scenario == "python":
            return [self.python, "-c", "pass"]
        if scenario == "noop-install":
            return self.kc("install", str(self.bundle), "--cache-dir", installed)
        if scenario == "noop-install-gpu":
            return self.kc("install", str(self.bundle), "--gpu", self.gpu, "--cache-dir", installed)
        if scenario == "env":
            return self.kc("env", "--cache-dir", installed)
        if scenario == "cold-install":
            self.cold += 1
            return self.kc("install", str(self.bundle), "--cache-dir", str(self.work / f"cold{self.cold}"))
        if scenario == "run":
            return self.kc("run", "--cache-dir", installed, "--", "/bin/true")
        if scenario == FLOOR:
            self.cold += 1
            out = self.work / f"cold{self.cold}"
            return ["sh", "-c", f"mkdir -p '{out}' && zstd -qdc '{self.bundle}' | tar -x -C '{out}'"]
        return self.kc("run", "--bundle", str(self.bundle), "--cache-dir", installed, "--", "/bin/true")

    def check_imported(self) -> None:
        """Refuse to measure a kernelcache other than the one named (a stray sys.path entry)."""
        probe = "import kernelcache, os; print(os.path.dirname(os.path.dirname(kernelcache.__file__)))"
        done = subprocess.run([self.python, "-c", probe], env=self.env, capture_output=True, text=True,
                              cwd=quiet_dir())
        found = Path(done.stdout.strip()).resolve()
        if found != self.root and not (self.venv and found.is_relative_to(self.root)):
            raise SystemExit(f"{self.label}: kernelcache is imported from {done.stdout.strip()}, not {self.root}")

    def commit(self) -> str:
        if self.venv:
            return subprocess.run(self.kc("--version"), capture_output=True, text=True).stdout.strip() or "?"
        done = subprocess.run(["git", "-C", str(self.root), "describe", "--always", "--dirty"],
                              capture_output=True, text=True)
        return done.stdout.strip() or "?"


def summary(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "p25": q[0], "p75": q[2], "min": min(values), "max": max(values)}


def scenarios(only: list[str]) -> tuple[str, ...]:
    """The scenarios (those in ``only`` where given), and the unpack floor where zstd and tar are on PATH."""
    every = (*SCENARIOS, FLOOR) if shutil.which("zstd") and shutil.which("tar") else SCENARIOS
    return tuple(name for name in every if not only or name in only)


def measure(sources: list[Source], runs: int, names: tuple[str, ...]) -> dict:
    results: dict = {s.label: {k: {"wall": [], "cpu": []} for k in (*names, "direct")} for s in sources}
    for _ in range(runs):
        for source in sources:
            for scenario in names:
                wall, cpu = timed(source.argv(scenario), source.env)
                results[source.label][scenario]["wall"].append(wall)
                results[source.label][scenario]["cpu"].append(cpu)
            wall, cpu = timed(["/bin/true"], source.env)
            results[source.label]["direct"]["wall"].append(wall)
            results[source.label]["direct"]["cpu"].append(cpu)
            for cold in source.work.glob("cold*"):
                shutil.rmtree(cold, ignore_errors=True)
    return results


def render(results: dict, runs: int, names: tuple[str, ...]) -> str:
    lines = ["| source | scenario | median wall (ms) | IQR (ms) | min-max (ms) | median CPU (ms) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for label, rows in results.items():
        direct = statistics.median(rows["direct"]["wall"])
        for name in names:
            wall, cpu = summary(rows[name]["wall"]), statistics.median(rows[name]["cpu"])
            shift = direct if name.startswith("run") else 0.0
            note = " (added to /bin/true)" if shift else ""
            lines.append(f"| {label} | {name}{note} | **{(wall['median'] - shift) * 1e3:.0f}** | "
                         f"{(wall['p25'] - shift) * 1e3:.0f}-{(wall['p75'] - shift) * 1e3:.0f} | "
                         f"{(wall['min'] - shift) * 1e3:.0f}-{(wall['max'] - shift) * 1e3:.0f} | {cpu * 1e3:.0f} |")
        lines.append(f"| {label} | /bin/true directly | {direct * 1e3:.1f} | | | |")
    return "\n".join(lines) + f"\n\n{runs} runs per row."


PARTS = r"""
import json, time
def clock():
    return time.perf_counter(), time.process_time()
def since(start):
    wall, cpu = clock()
    return {"wall": wall - start[0], "cpu": cpu - start[1]}
parts, t = {}, clock()
from kernelcache.format.envkey import environment_key
environment_key()
parts["key"] = since(t); t = clock()
import triton
from triton.runtime.cache import triton_key
parts["import triton"] = since(t); t = clock()
triton_key()
parts["triton_key()"] = since(t); t = clock()
from kernelcache.format.fingerprint import key_env_vars, ptxas_version
ptxas_version("sm_90"), key_env_vars()
parts["ptxas, variables"] = since(t)
print(json.dumps(parts))
"""


def fingerprint_parts(source: Source, runs: int) -> str:
    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(runs):
        done = subprocess.run([source.python, "-c", PARTS], env=source.env, capture_output=True, text=True,
                              cwd=quiet_dir())
        for name, times in json.loads(done.stdout).items():
            for kind, value in times.items():
                rows.setdefault(name, {}).setdefault(kind, []).append(value)
    lines = ["| part of a first fingerprint | median wall (ms) | min-max (ms) | median CPU (ms) |",
             "| --- | --- | --- | --- |"]
    for name, times in rows.items():
        wall = summary(times["wall"])
        lines.append(f"| {name} | {wall['median'] * 1e3:.0f} | {wall['min'] * 1e3:.0f}-{wall['max'] * 1e3:.0f} | "
                     f"{statistics.median(times['cpu']) * 1e3:.0f} |")
    return "\n".join(lines) + f"\n\n{runs} fresh processes ({source.label})."


def machine(python: str) -> str:
    probe = ("import importlib.metadata as m, platform, json; v = {}\n"
             "for d in ('triton', 'torch', 'vllm', 'click', 'rich', 'zstandard'):\n"
             "    try: v[d] = m.version(d)\n    except m.PackageNotFoundError: v[d] = None\n"
             "print(json.dumps({'python': platform.python_version(), **v}))")
    versions = subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout.strip()
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    return f"{model}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {versions}"


def bare_venv(python: str, where: Path, extra: list[str]) -> str:
    """A venv without pip whose site-packages holds one ``.pth`` naming ``python``'s site dirs (paths a ``.pth``
    adds are not scanned for ``.pth`` files themselves); its interpreter."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(where)], check=True)
    probe = "import sysconfig, json; p = sysconfig.get_paths(); print(json.dumps([p['purelib'], p['platlib']]))"
    dirs = json.loads(subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout)
    bare = str(where / "bin" / "python")
    own = json.loads(subprocess.run([bare, "-c", probe], capture_output=True, text=True, check=True).stdout)[0]
    Path(own, "packages.pth").write_text("\n".join(dict.fromkeys([*dirs, *extra])) + "\n")
    return bare


def make_source(pair: str, python: str, bundle: Path, work: Path, path: tuple[str, ...] = (),
                venv: bool = False) -> Source:
    """``LABEL=DIR`` or ``LABEL=DIR@BUNDLE`` (that tree's own copy of the bundle); ``path``: more PYTHONPATH;
    ``venv``: DIR is a venv with kernelcache installed."""
    label, _, rest = pair.partition("=")
    root, _, own = rest.partition("@")
    return Source(label, Path(root).absolute() if venv else Path(root).resolve(), python,
                  Path(own or bundle).resolve(), work, path, venv)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle", required=True, type=Path)
    parser.add_argument("--source", action="append", default=[],
                        help="LABEL=DIR or LABEL=DIR@BUNDLE (default: after=this tree)")
    parser.add_argument("--venv", action="append", default=[],
                        help="LABEL=DIR or LABEL=DIR@BUNDLE: a venv with kernelcache installed, its console script")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--scenario", action="append", default=[], choices=[*SCENARIOS, FLOOR],
                        help="Measure only this scenario (repeatable; default: all).")
    parser.add_argument("--parts", action="store_true", help="Also time the parts of a first fingerprint.")
    parser.add_argument("--json", type=Path, default=None, help="Also write every measurement here.")
    parser.add_argument("--as-installed", action=argparse.BooleanOptionalAction, default=True,
                        help="Run under a bare venv that sees --python's packages but not its .pth files.")
    parser.add_argument("--site", action="append", default=[], type=Path,
                        help="Another packages dir the commands see (after --python's); repeatable.")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kc-podstart-"))
    if args.as_installed:
        args.python = bare_venv(args.python, work / "venv", [str(d.resolve()) for d in args.site])
    pairs = args.source or ([] if args.venv else [f"after={Path(__file__).resolve().parents[1]}"])
    path = () if args.as_installed else tuple(str(d.resolve()) for d in args.site)  # else in the bare venv's .pth
    sources = [make_source(pair, args.python, args.bundle, work, path) for pair in pairs]
    sources += [make_source(pair, args.python, args.bundle, work, venv=True) for pair in args.venv]
    print(f"before: {machine(args.python)}", flush=True)
    for source in sources:
        source.prepare()
        source.check_imported()
    names = scenarios(args.scenario)
    results = measure(sources, args.runs, names)
    print(render(results, args.runs, names))
    if args.parts:
        print(fingerprint_parts(sources[-1], args.runs))  # the newest source: older ones may lack envkey
    print(f"after: {machine(args.python)}")
    print("sources: " + ", ".join(f"{s.label}={s.root} ({s.commit()})" for s in sources))
    for venv in (s for s in sources if s.venv):
        print(f"{venv.label}: {machine(venv.python)}")
    print(f"bundle: {args.bundle} ({args.bundle.stat().st_size / 2**20:.1f} MiB)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
