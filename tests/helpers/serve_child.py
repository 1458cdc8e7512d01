"""One configuring child for many serve commands: exercise/vllm_serve.py's child (``main``) kept running, so that a
test module that configures several commands imports vLLM once, not once per command (about 13 s of CPU each).

``KeptChild.run`` answers as ``vllm_serve._run_child`` does (the answer and the modules of ``imports`` the child
imported), from the same ``main`` with the same environment; a request it does not answer (a refusal, a crash) is
asked again of a fresh child, ``_run_child`` itself, so errors are what a build sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from helpers.common import ROOT

from kernelcache.exercise import vllm_serve

DONE = "kernelcache-kept-child-done"
LOOP = f"""
import sys
from kernelcache.exercise import vllm_serve
for line in sys.stdin:
    try:
        code = vllm_serve.main(line.strip())
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        code = 1
    print("{DONE}", code, flush=True)
"""


class KeptChild:
    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        # vllm_serve._run_child's environment, HF_HOME one directory for every request
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
               "HF_HOME": os.environ.get("HF_HOME", str(scratch / "hf"))}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.child = subprocess.Popen([sys.executable, "-c", LOOP], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def run(self, request: dict, imports: list[str]) -> tuple[dict, tuple[str, ...]]:
        """``vllm_serve._run_child(request, imports)``, answered by the kept child."""
        with tempfile.TemporaryDirectory(dir=self.scratch) as where:
            ask, answer = Path(where, "request.json"), Path(where, "answer.json")
            imported = Path(where, "imported.json")
            ask.write_text(json.dumps({**request, "answer": str(answer), "imports": imports,
                                       "imported": str(imported)}))
            if self._answered(ask) and answer.is_file():
                return json.loads(answer.read_text()), vllm_serve._imported(imported)
        return vllm_serve._run_child(request, imports)

    def _answered(self, ask: Path) -> bool:
        try:
            self.child.stdin.write(f"{ask}\n")
            self.child.stdin.flush()
        except OSError:  # the child ended
            return False
        for line in self.child.stdout:  # vLLM may print to stdout too
            if line.startswith(DONE):
                return line.split()[1] == "0"
        return False  # the child ended

    def close(self) -> None:
        self.child.stdin.close()
        try:
            self.child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()
