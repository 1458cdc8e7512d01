"""What most tests share: the repository root, a clean environment, the CLI as users run it, one real
exercise process, and a snapshot of a directory tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from kernelcache.exercise.worker import Job
from kernelcache.plan.tasks import Task

ROOT = Path(__file__).resolve().parents[2]

TESTKERNELS = Task("kernelcache.exercise.testkernels:run", label="testkernels")

# A probe for a served process: is triton_key seeded, does it equal Triton's own computation, was libtriton opened?
SERVED = r"""
import json, sys
import triton.runtime.cache as c
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
value = c.triton_key()
read_lib = any("libtriton" in p for p in opened)
real = c.triton_key.__wrapped__() if getattr(c.triton_key, "kernelcache_seeded", False) else value
print(json.dumps({"seeded": getattr(c.triton_key, "kernelcache_seeded", False), "equal": value == real,
                  "read_libtriton": read_lib}))
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without Triton/kernelcache settings, plus ``extra``; builds use no build
    cache (``KERNELCACHE_BUILD_CACHE=off``) unless ``extra`` names one."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRITON_", "KERNELCACHE_", "FLASHINFER_")) and k not in ("PTXAS_OPTIONS",)}
    env["KERNELCACHE_BUILD_CACHE"] = "off"
    env.update(extra)
    return env


# The kernelcache command as its console script runs it (kernelcache/entry.py), then one JSON line on stderr: its
# exit code and which of the WATCHED modules it imported (json only after: it imports re, collections, functools).
ENTRY_PROBE = r"""
import sys
started = set(sys.modules)
from kernelcache.entry import main
sys.argv[0] = "kernelcache"
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
imported = [m for m in WATCHED if m in sys.modules and m not in started]
import json
print(json.dumps({"exit": code, "imported": imported}), file=sys.stderr)
"""


def entry_point(*args: str, watched: tuple[str, ...], python: str | Path = sys.executable,
                **env: str) -> tuple[dict, subprocess.CompletedProcess]:
    """({exit, imported}, the process) of ``kernelcache ARGS`` run by ``python`` in a fresh process with
    ``clean_env(**env)``; a watched module the interpreter imported before the command started does not count."""
    probe = ENTRY_PROBE.replace("WATCHED", repr(watched))
    done = subprocess.run([str(python), "-c", probe, *args], env=clean_env(**env), capture_output=True,
                          text=True, timeout=600)
    return json.loads(done.stderr.strip().splitlines()[-1]), done


def bare_venv(where: Path) -> Path:
    """A venv without pip whose one ``.pth`` names this interpreter's site-packages dirs, and its interpreter: their
    packages, but not their ``.pth`` files (paths a ``.pth`` adds are not scanned for more), so not the import finder
    of an editable install, which imports half the standard library at every start; as a user's image starts."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    probe = "import json, sysconfig; p = sysconfig.get_paths(); print(json.dumps([p['purelib'], p['platlib']]))"
    own = json.loads(subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout)
    ours = sysconfig.get_paths()
    Path(own[0], "packages.pth").write_text("\n".join(dict.fromkeys([ours["purelib"], ours["platlib"]])) + "\n")
    return python


def run_job(workdir: Path, cache_dir: Path, capability: int, tasks=(TESTKERNELS,), sm_count: int = 132,
            env: dict | None = None, prebuild: bool = True) -> tuple[dict, list[dict]]:
    """Run one exercise worker; return its result and its compile log."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "compiles.jsonl"
    log.unlink(missing_ok=True)
    job = Job(cache_dir=str(cache_dir), compile_log=str(log), capability=capability, sm_count=sm_count,
              mode="cross", tasks=tuple(tasks), prebuild=prebuild)
    path = workdir / "job.json"
    path.write_text(job.to_json())
    done = subprocess.run([sys.executable, "-m", "kernelcache.exercise.worker", str(path)],
                          env=clean_env(**(env or {})), capture_output=True, text=True, timeout=900)
    result = json.loads((workdir / "job.json.result").read_text())
    assert done.returncode == 0, (done.stderr[-3000:], result)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    records = [r for r in records if r.get("event", "compile") == "compile"]  # not the gcc builds
    return result, records


def kc(*args: str, env: dict | None = None, check: bool = False, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the kernelcache CLI in a subprocess (as users do)."""
    done = subprocess.run([sys.executable, "-m", "kernelcache", *args], env=clean_env(**(env or {})),
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    return done


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with (size, mtime_ns), to prove nothing was written."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}
