#!/usr/bin/env python3
"""The first sampler call of a user's fresh process, with a bundle served by kernelcache and with a plain warm cache.

What a user's process meets (issue 32), timed so that it cannot flatter the bundle:

* paths: ``k``, ``mrv1`` and ``mrv2``: each process is a fresh one of scripts/gpu/first_call_process.py, which says
  what runs before the clock and what the clock covers, where the first call goes and what it uses besides wall time;
* modes: ``warm`` (a plain Triton cache that cold processes of the same paths left; ``TRITON_CACHE_DIR`` only),
  ``served`` (``python3 -m kernelcache run --cache-dir D -- ...`` on the installed bundle, after the first served
  process of that cache: what a second served process meets), ``served-fresh`` (the first served process after a
  fresh install: each one's own new cache dir, the bundle installed into it just before the process starts, as a
  pod's init container installs it; it replays the bundle's walk records), ``served-walk`` (``served`` with
  ``KERNELCACHE_REPLAY_WALKS=0``: Triton walks every kernel) and, when asked, ``served-eager``
  (``CUDA_MODULE_LOADING=EAGER``: torch's kernels loaded before the clock, which tells what CUDA's lazy loading
  costs the call);
* rounds interleave the modes per path (warm, served, served-walk in odd rounds, reversed in even ones, so that no
  mode always runs right after another), in two phases: ``quiet`` (the GPU idle before) and ``busy`` (a matmul loop
  right before each timed call, and 10 s of it before each batch). Before the rounds, the first served process of
  each path in the shared install (what it walks the bundle's records do not cover, and keeps at exit).

To fit one device call, the processes of a batch start together, each does everything before the clock, says
READY and waits on its stdin; the driver then lets one at a time run its timed part and exit (the others sleep in a
read), so no timed call shares the CPU or GPU, and each runs on the same CPU (``--pin``; the busy phase's matmul
loop on the others). One extra process per path and mode runs its first call under cProfile (``served`` ones with
``KERNELCACHE_DEBUG=1``). Everything is written as it comes (``rows.jsonl``, ``profiles.jsonl``; the tables:
scripts/gpu/first_call_summary.py): a failed process or mode loses nothing else.

    python3 scripts/gpu/first_call_rounds.py --bundles '.carry/fc/*.tar.zst' --out $OUT --rounds 3
    python3 scripts/gpu/first_call_rounds.py --modes warm,served,served-fresh --rounds 3    # what a pod meets
    python3 scripts/gpu/first_call_rounds.py --summarise $OUT/rows.jsonl      # the tables again, from the rows
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
PROCESS = HERE.parent / "first_call_process.py"  # one timed process, and the matmul loop
sys.path.insert(0, str(HERE.parent))  # its sibling scripts import by name
from first_call_process import PATHS  # noqa: E402 -- found through the path just set
from first_call_summary import write_summary  # noqa: E402


class Child:
    """One harness process of the driver: started now, told GO later; its stdout lines in a queue."""

    def __init__(self, spec: dict, command: list[str], env: dict, workdir: Path):
        self.spec = spec
        self.stderr_path = workdir / f"child-{spec['id']}.err"
        self.stderr = open(self.stderr_path, "w")  # noqa: SIM115 -- closed in finish()
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, text=True, cwd=str(REPO))
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, word: str, timeout: float) -> str | None:
        """The first line starting with ``word``, or None (the process ended or the time ran out)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith(word):
                return line

    def go(self, timeout: float) -> dict:
        """Release the process; its row (result or error), once it has exited."""
        row = dict(self.spec)
        if self.spec.get("wait", True):
            try:
                self.process.stdin.write("GO\n")
                self.process.stdin.flush()
            except OSError:  # it ended already: what it printed says why
                pass
        line = self.wait_for("RESULT ", timeout)
        if line is None:
            return self.finish({**row, "error": "no result"})
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return self.finish({**row, **json.loads(line[len("RESULT "):])})

    def finish(self, row: dict) -> dict:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stderr.close()
        text = self.stderr_path.read_text(errors="replace")
        row["debug"] = [line for line in text.splitlines() if line.startswith("kernelcache[")]
        if row["debug"]:
            walks = [line.split(": ")[2].split(" ")[0] for line in row["debug"] if "Triton's walk of " in line]
            row["walks"] = {how: walks.count(how) for how in sorted(set(walks))}
        if "error" in row or self.process.returncode:
            row["returncode"] = self.process.returncode
            row["stderr_tail"] = text[-3000:]
        return row


class Driver:
    def __init__(self, args):
        self.args = args
        self.fake = args.fake  # a CPU dry run: fake sm_90 target, no GPU check, no GPU work
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="kc-rounds-"))
        self.deadline = time.monotonic() + args.budget
        self.rows: list[dict] = []
        self.served = self.work / "served"
        self.warm = self.work / "warm"
        self.pin = None if args.no_pin else args.pin if args.pin is not None else max(os.sched_getaffinity(0))
        self.bundle = ""  # the one installed (``install``): every served-fresh process gets a new install of it
        self.next_id = 0
        self.children: list[Child] = []  # started and not finished: ended if the driver is
        self.gpu: subprocess.Popen | None = None

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    # -- set-up --
    def install(self) -> str:
        """Install the first bundle the GPU check accepts; its path."""
        for bundle in sorted(glob.glob(self.args.bundles)):
            done = self.install_into(bundle, self.served)
            self.say(f"install {bundle}: exit {done.returncode} {(done.stdout + done.stderr).strip()[-400:]}")
            if done.returncode == 0:
                self.bundle = bundle
                return bundle
        raise SystemExit("no bundle installs on this GPU")

    def install_into(self, bundle: str, cache: Path) -> subprocess.CompletedProcess:
        check = ["--no-gpu-check"] if self.fake else []  # a dry run has no GPU to check the bundle against
        return subprocess.run([sys.executable, "-m", "kernelcache", "install", bundle, "--cache-dir", str(cache),
                               *check], capture_output=True, text=True, env=self.env(), cwd=str(REPO))

    def fresh_cache(self, spec: dict) -> Path:
        """A new cache dir with the bundle freshly installed, for one ``served-fresh`` process (off its clock: the
        process starts after the install, as a pod's server after its init container)."""
        cache = self.work / f"fresh-{spec['id']}"
        done = self.install_into(self.bundle, cache)
        if done.returncode:
            raise OSError(f"install into {cache}: exit {done.returncode} {(done.stdout + done.stderr)[-400:]}")
        return cache

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "KERNELCACHE_"))}
        return {**env, "VLLM_USE_FLASHINFER_SAMPLER": "0", **extra}

    def command(self, spec: dict) -> tuple[list[str], dict]:
        harness = [sys.executable, str(PROCESS), spec["path"]]
        if self.pin is not None:
            harness += ["--pin", str(self.pin)]
        if spec.get("profile"):
            harness.append("--profile")
        if spec.get("wait", True):
            harness.append("--wait")
        if self.fake:
            harness.append("--fake")
        mode = spec["mode"]
        if mode in ("warm", "cold"):
            return harness, self.env(TRITON_CACHE_DIR=str(self.warm))
        extra = {"KERNELCACHE_REPLAY_WALKS": "0"} if mode == "served-walk" else {}
        if mode == "served-eager":
            extra["CUDA_MODULE_LOADING"] = "EAGER"
        if spec.get("profile") or spec.get("debug"):
            extra["KERNELCACHE_DEBUG"] = "1"
        cache = self.fresh_cache(spec) if mode == "served-fresh" else self.served
        run = [sys.executable, "-m", "kernelcache", "run", "--cache-dir", str(cache), "--"]
        return run + harness, self.env(**extra)

    def spec(self, phase: str, rnd: int, path: str, mode: str, **more) -> dict:
        self.next_id += 1
        return {"id": self.next_id, "phase": phase, "round": rnd, "path": path, "mode": mode, **more}

    def cold(self) -> None:
        """Cold processes (one per path, side by side) fill the plain cache that ``warm`` processes then read."""
        paths = self.args.paths.split(",")
        children = [self.start(self.spec("setup", 0, path, "cold", wait=False)) for path in paths]
        for item in children:
            row = item.go(timeout=max(60.0, self.left())) if item else None
            if row:
                self.record(row)

    # -- batches --
    def start(self, spec: dict) -> Child | None:
        try:
            command, env = self.command(spec)
            self.children.append(Child(spec, command, env, self.work))
            return self.children[-1]
        except OSError as exc:
            self.record({**spec, "error": f"could not start: {exc}"})
            return None

    def batch(self, specs: list[dict], busy: bool) -> None:
        """Start ``specs`` together, wait until each is READY, then time them one at a time, in order."""
        if self.left() < 60:
            self.say(f"skipped a batch of {len(specs)}: {self.left():.0f} s left")
            return
        self.say(f"batch of {len(specs)} ({'busy' if busy else 'quiet'}): starting")
        children = [c for c in (self.start(s) for s in specs) if c]
        ready = []
        for item in children:
            if item.wait_for("READY", timeout=max(5.0, min(300.0, self.left() - 30))) is None:
                self.record(item.finish({**item.spec, "error": "never became ready"}))
            else:
                ready.append(item)
        self.say(f"batch ready: {len(ready)} of {len(children)}")
        if busy:
            self.gpu_work(self.args.busy_start)
        for item in ready:
            if self.left() < 15:
                self.record(item.finish({**item.spec, "error": "out of time before its turn"}))
                continue
            if busy:
                self.gpu_work(self.args.busy_each)
            self.record(item.go(timeout=min(120.0, self.left())))

    def gpu_work(self, seconds: float) -> None:
        if self.fake:  # no GPU to keep busy
            return
        if self.gpu is None:
            avoid = [] if self.pin is None else ["--pin", str(self.pin)]
            self.gpu = subprocess.Popen([sys.executable, str(PROCESS), "--gpu-work", *avoid], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=self.env(), cwd=str(REPO))
            self.gpu.stdout.readline()
        self.gpu.stdin.write(f"WORK {seconds}\n")
        self.gpu.stdin.flush()
        self.gpu.stdout.readline()

    def record(self, row: dict) -> None:
        row["wall_clock"] = time.strftime("%H:%M:%S")
        self.rows.append(row)
        with open(self.out / "rows.jsonl", "a") as handle:
            handle.write(json.dumps({k: v for k, v in row.items() if k != "top"}) + "\n")
        if row.get("top") or row.get("debug"):
            with open(self.out / "profiles.jsonl", "a") as handle:
                handle.write(json.dumps({k: row.get(k) for k in ("id", "phase", "round", "path", "mode", "profile",
                                                                 "first_call", "first_call_phases", "top", "debug")})
                             + "\n")
        what = f"{row['phase']} r{row['round']} {row['path']:4s} {row['mode']:12s}"
        if "error" in row:
            self.say(f"{what} ERROR {row['error']}")
        else:
            self.say(f"{what} first {row['first_call'] * 1000:7.1f} ms  second {row['second_call'] * 1000:6.2f} ms  "
                     f"compiles {row['compiles']} builds {len(row['builds'])}")
        write_summary(self.rows, self.out)

    def plan(self) -> list[tuple[list[dict], bool]]:
        """The batches: the first served process of each path (in the fresh install: it walks every kernel and keeps
        the walks at exit; the next paths' first ones replay the kernels they share), quiet rounds, the profiled
        processes after the first quiet batch (so a short run still has them), busy rounds, then one ``served-eager``
        process per path if time is left."""
        modes, rounds, paths = self.args.modes.split(","), self.args.rounds, self.args.paths.split(",")
        firsts = [self.spec("quiet", 0, p, "served", first_in_cache=True, debug=True) for p in paths]
        quiet = firsts + [self.spec("quiet", r, p, m) for r in range(1, rounds + 1) for p in paths
                          for m in round_order(modes, r)]
        busy = [self.spec("busy", r, p, m) for r in range(1, rounds + 1) for p in paths for m in round_order(modes, r)]
        profiles = [self.spec("profile", 0, p, m, profile=True) for p in paths for m in modes]
        size = self.args.batch
        batches = [(quiet[i:i + size], False) for i in range(0, len(quiet), size)]
        batches.insert(1, (profiles, False))
        batches += [(busy[i:i + size], True) for i in range(0, len(busy), size)]
        if "served-eager" not in modes and not self.args.no_eager:  # what CUDA's lazy loading costs, if time is left
            batches.append(([self.spec("diagnostic", 0, p, "served-eager", debug=True) for p in paths], False))
        return batches

    def run(self) -> int:
        import signal

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: the finally below still runs
        try:
            self.say(f"work dir {self.work}; installed {self.install()} into {self.served}")
            self.cold()
            for specs, busy in self.plan():
                self.batch(specs, busy)
        finally:
            for item in self.children:
                if item.process.poll() is None:
                    item.process.kill()
            if self.gpu is not None:
                self.gpu.kill()
            write_summary(self.rows, self.out)
            self.say(f"done: {len(self.rows)} processes, {sum('error' in r for r in self.rows)} failed")
        return 0


def round_order(modes: list[str], rnd: int) -> list[str]:
    """The modes in the order given in odd rounds and reversed in even ones, so that no mode always runs right after
    another (a process's speed follows what ran before it: served-fresh after served in every round made any such
    drift look like a difference between them)."""
    return list(modes) if rnd % 2 else list(reversed(modes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pin", type=int, help="the CPU every timed part runs on (default: the highest the driver "
                                                "may use); the busy phase's matmul loop runs on the others")
    parser.add_argument("--no-pin", action="store_true", help="timed parts run on any CPU")
    parser.add_argument("--fake", action="store_true", help="a CPU dry run: fake sm_90 target")
    parser.add_argument("--summarise", metavar="ROWS", help="rewrite summary.json/.md beside ROWS (rows.jsonl)")
    parser.add_argument("--bundles", default=".carry/fc/*.tar.zst", help="glob; the first the GPU check accepts")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--modes", default="warm,served,served-walk",
                        help="of warm, served, served-fresh, served-walk, served-eager (in the order each round "
                             "runs them)")
    parser.add_argument("--batch", type=int, default=15, help="processes started together")
    parser.add_argument("--no-eager", action="store_true", help="no closing served-eager batch")
    parser.add_argument("--busy-start", type=float, default=10.0, help="seconds of matmuls before a busy batch")
    parser.add_argument("--busy-each", type=float, default=1.5, help="seconds of matmuls before each busy call")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds from the start after which no process is started or released")
    args = parser.parse_args()
    if args.summarise:
        rows = [json.loads(line) for line in Path(args.summarise).read_text().splitlines() if line.strip()]
        write_summary(rows, Path(args.summarise).parent)
        print((Path(args.summarise).parent / "summary.md").read_text())
        return 0
    return Driver(args).run()


if __name__ == "__main__":
    sys.exit(main())
