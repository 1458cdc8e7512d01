"""What a build checks before its first exercise process: everything its plan will need, so that a broken
environment fails in seconds with the cause and the fix, not after minutes of Triton compiles.

``CHECKS`` is the table, run in order; each row says when it applies (the plan's paths, the targets' modes) and
raises a ``KernelcacheError`` of its own exit code (docs/FORMAT.md):

* vLLM installed (find_spec; 30), and every module the plan's paths need found on disk (31, plan/targets.py);
* no clash between packages that write the same files (35): ``uv pip install vllm==0.33.0`` installs cuda-python
  12.6.2.post1, whose wheel carries its own ``cuda/bindings/`` and replaces files of cuda-bindings 13.5.0
  (``runtime.cpython-*.so`` among them); ``import flashinfer`` then fails with ``module 'cuda.bindings.runtime'
  has no attribute 'cudaLibrary_t'``. Found from the two distributions' RECORD files: a path both list whose
  installed bytes are not the ones the owner's RECORD hashes. Only where the plan has a FlashInfer path;
* vLLM (and FlashInfer, where the plan has a FlashInfer path) importable, in a child process of this
  interpreter as the exercise processes will import them (34, with the error the import raised);
* the CUDA toolchain that builds FlashInfer's modules, for a cross target of a FlashInfer path (33;
  exercise/flashinfer_sampling.py ``ensure_toolchain``, which fetches it when it is missing).

A first build of a serve command has imported vLLM already, in the child that configured the command
(exercise/vllm_serve.py); that child imports what the import row would (``IMPORTABLE``, after its answer is written)
and ``remember_imports`` keeps its passes as the row's own, so the build starts no second vLLM import.

A pass of the slow rows (the import, the RECORD hashes) is remembered under
``$XDG_CACHE_HOME/kernelcache/preflight/`` (``~/.cache/kernelcache/preflight``), keyed by this interpreter and every
installed distribution's metadata dir by name, inode and mtime (an install, upgrade or ``--reinstall`` changes
one), so a second build in the same environment pays milliseconds. Failures are never remembered.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import ImportFailed, MissingDependency, PackageClash
from .usercache import user_cache
from .version import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .plan.recipe import BuildPlan
    from .plan.targets import BuildTarget

# (owner, the package whose wheel also carries some of the owner's files): the pairs known to clash.
CLASHES = (("cuda-bindings", "cuda-python"),)
IMPORT_TIMEOUT = 900  # seconds: vLLM's import on a loaded 2-core box takes a minute


@dataclass(frozen=True)
class Check:
    """One row of the preflight table. ``applies(plan, targets)``: whether the build needs it; ``run`` raises the
    failure; ``remembered``: a pass is kept under the installed distributions' key (the slow rows)."""

    name: str
    applies: Callable[[BuildPlan, Sequence[BuildTarget]], bool]
    run: Callable[[BuildPlan, Sequence[BuildTarget]], None]
    remembered: bool = False


@dataclass(frozen=True)
class PreflightResult:
    seconds: float
    ran: tuple[str, ...]  # the rows that ran their check now
    remembered: tuple[str, ...]  # the rows a pass remembered from an earlier build answered


def has_flashinfer(plan: BuildPlan, targets: Sequence[BuildTarget] = ()) -> bool:
    """Whether the plan has a path that imports FlashInfer and builds its modules (``Family.flashinfer``)."""
    from .plan import families

    return any(p in families.flashinfer() for p in plan.paths)


def _always(plan: BuildPlan, targets: Sequence[BuildTarget]) -> bool:
    return True


def _cross_flashinfer(plan: BuildPlan, targets: Sequence[BuildTarget]) -> bool:
    return has_flashinfer(plan) and any(t.mode == "cross" for t in targets)


def _vllm_installed(plan: BuildPlan, targets: Sequence[BuildTarget]) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise MissingDependency(f"vLLM is not installed in {sys.executable}; `kernelcache build` runs vLLM's own "
                                "code: install the serving image's vllm here (pip install vllm==<its version>)")


def _paths_installed(plan: BuildPlan, targets: Sequence[BuildTarget]) -> None:
    from .plan.targets import check_paths

    check_paths(plan)


def _no_clash(plan: BuildPlan, targets: Sequence[BuildTarget]) -> None:
    for owner, other in CLASHES:
        replaced = overwritten(owner, other)
        if replaced:
            raise PackageClash(clash_message(owner, other, replaced))


def _imports(plan: BuildPlan, targets: Sequence[BuildTarget]) -> None:
    failed = import_errors(imports_of(plan))
    if failed:
        name, error = next(iter(failed.items()))
        raise ImportFailed(f"{name} is installed but does not import in {sys.executable}: {error} "
                           f"(`{sys.executable} -c 'import {name}'` shows where)")


def _toolchain(plan: BuildPlan, targets: Sequence[BuildTarget]) -> None:
    from .exercise.flashinfer_sampling import ensure_toolchain

    ensure_toolchain()


IMPORTS = Check("imports", _always, _imports, remembered=True)
CHECKS = (
    Check("vllm installed", _always, _vllm_installed),
    Check("paths installed", _always, _paths_installed),
    Check("no package clash", has_flashinfer, _no_clash, remembered=True),
    IMPORTS,
    Check("flashinfer toolchain", _cross_flashinfer, _toolchain),
)


def preflight(plan: BuildPlan, targets: Sequence[BuildTarget], checks: Sequence[Check] = CHECKS,
              memory: Path | None = None) -> PreflightResult:
    """Run every row of ``checks`` that applies to the plan and its targets, in order; the first failure raises.
    ``memory``: where passes are remembered (None: ``default_dir()``)."""
    started = time.perf_counter()
    memory = memory or default_dir()
    ran: list[str] = []
    kept: list[str] = []
    installed = None
    for check in (c for c in checks if c.applies(plan, targets)):
        if check.remembered:
            installed = installed or installed_key()
            mark = memory / _mark_name(installed, check, has_flashinfer(plan))
            if mark.is_file():
                kept.append(check.name)
                continue
        check.run(plan, targets)
        ran.append(check.name)
        if check.remembered:
            _remember(mark)
    return PreflightResult(time.perf_counter() - started, tuple(ran), tuple(kept))


def default_dir() -> Path:
    return user_cache("preflight")


def installed_key() -> str:
    """This interpreter and every distribution installed on its ``sys.path`` (metadata dir by name, inode and
    mtime), as one digest."""
    seen = [os.path.realpath(sys.executable), sys.version, __version__]
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            if name.endswith((".dist-info", ".egg-info", ".egg-link", ".pth")):
                stat = os.stat(os.path.join(entry or ".", name))
                seen.append(f"{entry}/{name} {stat.st_ino} {stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(seen).encode()).hexdigest()


def _mark_name(installed: str, check: Check, flashinfer: bool) -> str:
    detail = json.dumps([installed, check.name, _modules(flashinfer), flashinfer])
    return hashlib.sha256(detail.encode()).hexdigest()[:32]


def remember_imports(imported: Sequence[str], memory: Path | None = None) -> None:
    """Keep a pass of the import row for every plan whose imports (``imports_of``) are all in ``imported``: modules
    a child process of this interpreter imported for another reason (the serve command's configuration), so that
    the build's preflight does not import them again. A module that failed there is checked by the row itself."""
    installed = installed_key()
    for flashinfer in (False, True):
        if set(_modules(flashinfer)) <= set(imported):
            _remember((memory or default_dir()) / _mark_name(installed, IMPORTS, flashinfer))


def _remember(mark: Path) -> None:
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    except OSError:
        pass  # an unwritable cache only costs the next build the same check


# -- the checks' own work ---------------------------------------------------------------------------------


IMPORTABLE = ("vllm", "flashinfer")  # what the import row may import: ``imports_of`` any plan is among them


def imports_of(plan: BuildPlan) -> list[str]:
    """The top-level packages the plan's exercise processes import (their submodules need the fake target)."""
    return _modules(has_flashinfer(plan))


def _modules(flashinfer: bool) -> list[str]:
    return ["vllm", *(["flashinfer"] if flashinfer else [])]


_IMPORT = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def import_errors(modules: Sequence[str]) -> dict[str, str]:
    """Per module that fails to import in a child process of this interpreter: the error it raised (one line)."""
    try:
        done = subprocess.run([sys.executable, "-c", _IMPORT, *modules], capture_output=True, text=True,
                              timeout=IMPORT_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {modules[0]: f"importing {' and '.join(modules)} took over {IMPORT_TIMEOUT}s"}
    lines = done.stdout.strip().splitlines()
    try:
        failed = json.loads(lines[-1]) if lines else None
    except ValueError:
        failed = None
    if not isinstance(failed, dict):  # the interpreter itself died (a crash in an extension module)
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {modules[0]: f"the importing process died ({tail})"}
    return {name: " ".join(str(error).split()) for name, error in failed.items()}


@dataclass(frozen=True)
class Replaced:
    path: str  # relative to the site dir
    owner_version: str
    other_version: str


def overwritten(owner: str, other: str) -> list[Replaced]:
    """The files of distribution ``owner`` that distribution ``other`` also lists in its RECORD and whose bytes on
    disk are not the ones ``owner``'s RECORD hashes: ``other``'s copy replaced them. Empty when either is absent."""
    import importlib.metadata

    try:
        mine, theirs = importlib.metadata.distribution(owner), importlib.metadata.distribution(other)
    except importlib.metadata.PackageNotFoundError:
        return []
    shared = {str(f) for f in theirs.files or ()}
    found = []
    for record in mine.files or ():
        if str(record) not in shared or record.hash is None or record.hash.mode != "sha256":
            continue
        if _urlsafe_sha256(Path(str(mine.locate_file(record)))) != record.hash.value:
            found.append(Replaced(str(record), mine.version, theirs.version))
    return found


def _urlsafe_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def clash_message(owner: str, other: str, replaced: Sequence[Replaced]) -> str:
    first = replaced[0]
    return (f"{other} {first.other_version} overwrote {len(replaced)} file(s) of {owner} {first.owner_version} "
            f"(e.g. {first.path}), so FlashInfer's import of cuda.bindings fails; reinstall {owner}: "
            f"uv pip install --reinstall-package {owner} {owner}=={first.owner_version} "
            f"(pip: pip install --force-reinstall --no-deps {owner}=={first.owner_version})")
