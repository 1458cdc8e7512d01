"""The ``compile`` path: vLLM's own torch.compile artifact in the bundle, built without a GPU.

Build: ``build_artifact`` runs exercise/vllm_compile.py in a child process (the CUDA-runtime shim preloaded, the
GPU hidden, ``VLLM_CACHE_ROOT`` a fresh directory) and takes what vLLM wrote under ``torch_compile_cache`` as one
bundle member, ``vllm-compile/<sha16>/torch_compile_cache.tar``, with its record ``vllm-compile/<sha16>/compile.json``:
the serve command, the product, what vLLM hashed into the directory's name (each factor named) and what the
artifact pins (Python's and torch's exact versions: torch's ``SystemInfo.check_compatibility`` compares
``platform.python_version()`` and ``torch.__version__`` by equality when Dynamo loads it).

Install: ``check`` computes the same factors in the serving environment (this interpreter, its vLLM, its
``VLLM_*`` variables) and refuses (``EngineCompileMismatch``, exit 23) naming the first that differs; the install
places the tree under ``<cache dir>/vllm/`` before its receipt (cachedir/vllm_tree.py; ``VLLM_CACHE_ROOT``: vLLM's
paths in it are relative to that root, so it is relocated as it is). ``environment`` gives ``VLLM_CACHE_ROOT`` and
``VLLM_FORCE_AOT_LOAD=1`` (a miss fails loudly instead of compiling).

Prune: ``pinned_here`` reads, without importing torch or vLLM, the versions a record pins, which any served command
and any ``VLLM_*`` setting needs equal; ``stale`` names those of an installed bundle that differ here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .cachedir.layout import VLLM_DIR
from .cachedir.vllm_tree import AOT_ROOT
from .errors import BuildFailed, EngineCompileMismatch, MissingDependency
from .format.envscan import distribution_version, package_dir
from .format.manifest import Member

ROOT = "vllm-compile"  # the bundle's top dir for it: vllm-compile/<sha16>/{compile.json,torch_compile_cache.tar}
RECORD, TREE = "compile.json", "torch_compile_cache.tar"
CACHE_ROOT = VLLM_DIR  # under the cache dir: VLLM_CACHE_ROOT of a served process
FORCE = "VLLM_FORCE_AOT_LOAD"
CACHE_ENV = "VLLM_CACHE_ROOT"
SERVE_ENV = "KERNELCACHE_SERVE_ENV"  # JSON {name: value}: the serving environment's hashed variables (--serve-env)
NO_GPU_TUNING = ("VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE", "VLLM_ENABLE_INDUCTOR_COORDINATE_DESCENT_TUNING")


def _child(request: dict, env: dict[str, str], python: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="kernelcache-compile-") as scratch:
        ask, answer = Path(scratch, "request.json"), Path(scratch, "answer.json")
        ask.write_text(json.dumps({**request, "answer": str(answer)}))
        done = subprocess.run([python, "-m", "kernelcache.exercise.vllm_compile", str(ask)], env=env,
                              capture_output=True, text=True)
        if answer.is_file():
            return json.loads(answer.read_text())
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise BuildFailed(f"vLLM's compile process exited {done.returncode}: {(lines or ['no output'])[-1][:400]}")


def _env(extra: dict[str, str]) -> dict[str, str]:
    here = str(Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "PYTHONPATH": here + (os.pathsep + path if path else ""), **extra}


def serve_env_of(pairs: tuple[str, ...] | list[str]) -> str:
    """``build --serve-env NAME=VALUE`` words as the JSON text of ``SERVE_ENV``; a name vLLM does not hash into the
    compile cache's key (``CUDA_HOME``, ``VLLM_*``: vllm/envs.py ``compile_factors``) or one the build sets itself
    is refused."""
    from .errors import UsageError

    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not (name == "CUDA_HOME" or name.startswith("VLLM_")) or name in (CACHE_ENV, FORCE):
            raise UsageError(f"--serve-env {pair!r}: give NAME=VALUE for CUDA_HOME or a VLLM_* variable other "
                             f"than {CACHE_ENV} and {FORCE}")
        values[name] = value
    return json.dumps(values, sort_keys=True)


def serve_env() -> dict[str, str]:
    """The serving environment's variables a build was given (``SERVE_ENV``), {} without."""
    text = os.environ.get(SERVE_ENV, "")
    return json.loads(text) if text else {}


def profile_request(profile) -> dict:
    from .plan.gpus import memory_mib

    return {"name": profile.name, "arch": profile.arch, "product": profile.product, "sm_count": profile.sm_count,
            "memory_mib": memory_mib(profile)}


def build_artifact(args: list[str], shown: str, profile, work: Path,
                   python: str = sys.executable) -> tuple[dict, list[Member]]:
    """vLLM's compile of ``vllm serve ARGS`` (a local model directory; ``shown``: the command as served) for
    ``profile``'s GPU, on the fake target: (the record, the two bundle members)."""
    from .exercise.fake_cuda_runtime import build_cudart_shim

    tuned = [name for name in NO_GPU_TUNING if os.environ.get(name, "0") not in ("", "0")]
    if tuned:
        raise BuildFailed(f"{tuned[0]} is set: Inductor would time candidate kernels on the GPU, which a build "
                          f"without one cannot do (unset it, or build this path with kernelcache capture on a GPU)")
    work.mkdir(parents=True, exist_ok=True)
    shim = build_cudart_shim(work / "shim")
    root, home = work / "vllm-cache", work / "home"
    shutil.rmtree(root, ignore_errors=True)
    home.mkdir(exist_ok=True)
    given = serve_env()
    report = _child({"mode": "build", "args": list(args), "shown": shown, "profile": profile_request(profile)},
                    _env({**given, "LD_PRELOAD": str(shim), "VLLM_CACHE_ROOT": str(root), "HOME": str(home),
                          "CUDA_VISIBLE_DEVICES": "", "KERNELCACHE_TARGET_MODE": "cross",
                          "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}), python)
    if not report.get("ok"):
        raise BuildFailed(f"vLLM's compile on the fake target failed: {report.get('error')}\n"
                          f"{report.get('traceback', '')[-3000:]}")
    data = _tar(root / "torch_compile_cache")
    record = {"format": 1, "command": shown, "gpu": profile.name, "product": profile.product, "arch": profile.arch,
              "hash_dir": _hash_dirs(report["artifacts"]), "artifacts": report["artifacts"],
              "tokens": report["tokens"], "left_out": report["left_out"],
              "tree_sha256": hashlib.sha256(data).hexdigest(),
              "hf_config": _model_config(args), "serve_env": given, **report["named"]}
    if record["key"] != record["hash_dir"]:  # the factors recorded are the ones vLLM named its directory by
        raise BuildFailed(f"vLLM's factors hash to {record['key'][:12]} after the compile, and vLLM saved "
                          f"{record['hash_dir'][:12]}")
    text = json.dumps(record, sort_keys=True, indent=1).encode()
    tag = hashlib.sha256(text).hexdigest()[:16]
    return record, [Member(f"{ROOT}/{tag}/{RECORD}", data=text), Member(f"{ROOT}/{tag}/{TREE}", data=data)]


def _model_config(args: list[str]) -> dict:
    from .plan.serve import ServeCommand

    return json.loads(Path(ServeCommand(tuple(args)).model, "config.json").read_text())


def _hash_dirs(artifacts: list[str]) -> str:
    dirs = {Path(a).parts[2] for a in artifacts}  # torch_compile_cache/torch_aot_compile/<hash>/rank_r_d/model
    if len(dirs) != 1:
        raise BuildFailed(f"vLLM saved {len(dirs)} AOT directories for one model: {sorted(dirs)}")
    return dirs.pop()


def _tar(folder: Path) -> bytes:
    """``folder`` as an uncompressed tar (the bundle compresses), names relative to its parent, sorted, with
    owners and times cleared (the same build gives the same bytes)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted([folder, *folder.rglob("*")]):
            info = tar.gettarinfo(str(path), str(path.relative_to(folder.parent)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_symlink():
                raise BuildFailed(f"vLLM's compile cache holds a link: {path}")
            with (open(path, "rb") if info.isfile() else io.BytesIO()) as stream:
                tar.addfile(info, stream if info.isfile() else None)
    return out.getvalue()


# -- install, verify, run ---------------------------------------------------------------------------------------


def records_of(files) -> list[tuple[str, str]]:
    """(record path, tree path) of each compile artifact among a manifest's files."""
    paths = {f.path for f in files}
    return [(p, p[: -len(RECORD)] + TREE) for p in sorted(paths)
            if p.startswith(ROOT + "/") and p.endswith("/" + RECORD) and p[: -len(RECORD)] + TREE in paths]


# What a record pins (exercise/vllm_compile.py ``named_factors``) that no served command or VLLM_* setting changes.
PINNED = {"python": "the Python version (torch's SystemInfo pins it exactly)", "torch": "the torch version",
          "vllm": "the vLLM version (VllmConfig.compute_hash hashes it)",
          "transformers": "the transformers version (ModelConfig hashes hf_config's JSON, which names it)"}


def pinned_differences(record: dict, here: dict) -> list[str]:
    """The keys of ``PINNED`` the record holds with a value other than ``here``'s."""
    return [key for key in PINNED if key in record and record.get(key) != here.get(key)]


def differences(record: dict, here: dict) -> list[str]:
    """What differs between the bundle's record and the serving environment's factors, most specific first: the
    Python and torch versions the artifact pins, each hashed ``VLLM_*`` variable, each config field, the rest."""
    out = [f"{PINNED[key]}: bundle {record.get(key)}, here {here.get(key)}" for key in pinned_differences(record, here)]
    env_a, env_b = record.get("env", {}), here.get("env", {})
    out += [f"{name}: bundle {env_a.get(name)!r}, here {env_b.get(name)!r}"
            for name in sorted(set(env_a) | set(env_b)) if env_a.get(name) != env_b.get(name)]
    conf_a, conf_b = record.get("configs", {}), here.get("configs", {})
    hashed_only = []  # a sub-config whose hash differs with no plain field that does (derived values: ranges, ...)
    for name in sorted(set(conf_a) | set(conf_b)):
        a, b = conf_a.get(name, {}), conf_b.get(name, {})
        if a.get("hash") == b.get("hash"):
            continue
        fa, fb = a.get("fields", {}), b.get("fields", {})
        fields = [line for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)
                  for line in _field_differences(f"{name}.{k}", fa.get(k), fb.get(k))]
        out += fields
        hashed_only += [] if fields else [f"{name} (its compute_hash differs)"]
    out += hashed_only
    if not out and record.get("factors") != here.get("factors"):
        labels = ["the VLLM_* environment", "VllmConfig.compute_hash()", "the system (product, CUDA, Triton)",
                  "torch_key", "Inductor's config", "functorch's config"]
        wrong = [i for i, (a, b) in enumerate(zip(record.get("factors", []), here.get("factors", []))) if a != b]
        out += [f"{labels[i] if i < len(labels) else f'factor {i}'} differs" for i in wrong] or ["the factor count"]
    return out


def _field_differences(label: str, a, b) -> list[str]:
    """A differing field, named; one that holds a JSON object on both sides (a Hugging Face config vLLM hashed as
    its ``to_json_string``) by its differing keys inside."""
    try:
        da, db = json.loads(a), json.loads(b)
    except (TypeError, ValueError):
        da = db = None
    if isinstance(da, dict) and isinstance(db, dict):
        inner = [f"{label}.{k}: bundle {da.get(k)!r}, here {db.get(k)!r}" for k in sorted(set(da) | set(db))
                 if da.get(k) != db.get(k)]
        if inner:
            return inner
    return [f"{label}: bundle {a!r}, here {b!r}"]


def factors_here(record: dict, serve: str | None = None, python: str = sys.executable) -> dict:
    """vLLM's factors in this environment for ``serve`` (the command the server runs; default: the record's own).
    A served model that is no local directory is configured from the config the record keeps (the model string,
    which vLLM hashes, stays the served one)."""
    from .plan.gpus import profile as gpu_profile
    from .plan.serve import ServeCommand

    command = ServeCommand.parse(serve or record["command"])
    local = command
    if not Path(command.model).is_dir():
        folder = Path(tempfile.mkdtemp(prefix="kernelcache-compile-model-"))
        (folder / "config.json").write_text(json.dumps(record["hf_config"]))
        local = command.with_model(str(folder))
    answer = _child({"mode": "factors", "args": list(local.args), "shown": command.text,
                     "profile": profile_request(gpu_profile(record["gpu"]))},
                    _env({"CUDA_VISIBLE_DEVICES": "", "VLLM_LOGGING_LEVEL": "ERROR"}), python)
    if not answer.get("ok"):
        if "No module named 'vllm'" in str(answer.get("error")):
            raise MissingDependency("vllm is not importable here: the compile artifact's hash needs the serving "
                                    "vLLM (install it, or install without the compile path's bundle)")
        raise EngineCompileMismatch(f"vLLM could not configure the bundle's serve command here: {answer.get('error')}")
    return answer["named"]


def check(record: dict, serve: str | None = None, python: str = sys.executable) -> None:
    """Refuse (exit 23) when vLLM here would not find the artifact for ``serve`` (default: the record's command),
    naming what differs."""
    differing = differences(record, factors_here(record, serve, python))
    if differing:
        more = f"; and {len(differing) - 3} more" if len(differing) > 3 else ""
        raise EngineCompileMismatch(f"vLLM would not load the bundle's compile artifact here "
                                    f"({record['hash_dir'][:12]}): {'; '.join(differing[:3])}{more}")


def installed_root(cache_dir: Path) -> Path | None:
    root = cache_dir / CACHE_ROOT
    return root if root.joinpath(*AOT_ROOT).is_dir() else None


def environment(cache_dir: Path) -> dict[str, str]:
    """``VLLM_CACHE_ROOT`` and ``VLLM_FORCE_AOT_LOAD=1`` when the cache dir holds an installed artifact."""
    root = installed_root(cache_dir)
    return {"VLLM_CACHE_ROOT": str(root), FORCE: "1"} if root else {}


@functools.cache
def pinned_here() -> dict[str, str | None]:
    """The versions a record pins, as ``named_factors`` reports them in this interpreter (``platform.python_version()``,
    ``torch.__version__``, ``vllm.__version__``, transformers' distribution version), read without importing torch or
    vLLM: each sets ``__version__`` in one generated file (torch/version.py; vllm/_version.py, whose absence or
    failure vllm/version.py answers with "dev"), run here alone. ``MissingDependency`` without torch or vLLM."""
    folders = {name: package_dir(name) for name in ("torch", "vllm")}
    if None in folders.values():
        missing = next(name for name, folder in folders.items() if folder is None)
        raise MissingDependency(f"{missing} is not installed here: whether a compile artifact matches the serving "
                                f"environment needs its torch and vLLM (run kernelcache in that environment)")
    torch = _version_set_by(Path(folders["torch"], "version.py"))
    if torch is None:
        raise MissingDependency(f"torch in {folders['torch']} has no readable version.py: its version is unknown")
    return {"python": platform.python_version(), "torch": torch,
            "vllm": _version_set_by(Path(folders["vllm"], "_version.py")) or "dev",
            "transformers": distribution_version("transformers")}


def _version_set_by(path: Path) -> str | None:
    """The ``__version__`` the module file ``path`` sets, the file run alone; None when it cannot be run or sets
    none."""
    spec = importlib.util.spec_from_file_location(f"_kernelcache_version_{path.parent.name}", path)
    if spec is None or spec.loader is None or not path.is_file():
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 -- vllm/version.py catches every exception of its _version import too
        return None
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else None


def stale(cache_dir: Path, manifest) -> list[tuple[str, str, str | None]]:
    """(what, the bundle's, here's) for each version an installed bundle's compile records pin that differs here
    (``pinned_here``): vLLM misses the artifact whatever command is served and whatever ``VLLM_*`` variables the
    server has. Those two, which only the serving process knows, ``check`` compares at install and verify. A record
    that cannot be read names nothing."""
    out = []
    for record_path, _ in records_of(manifest.files()):
        try:
            record = json.loads((cache_dir / record_path).read_text())
        except (OSError, ValueError):
            continue
        here = pinned_here()
        out += [(key, str(record[key]), here[key]) for key in pinned_differences(record, here)]
    return out


def bundle_records(bundle: Path, limits=None) -> list[dict]:
    """The compile records a bundle file carries (its ``vllm-compile/<sha16>/compile.json`` members, verified)."""
    from .format import archive

    out = []
    for _, name, data in archive.iter_members(bundle, limits):
        if name.startswith(ROOT + "/") and name.endswith("/" + RECORD):
            out.append(json.loads(data))
    return out


def check_bundle(bundle: Path, limits=None, serve: str | None = None) -> list[dict]:
    """``check`` each compile record of a bundle file for ``serve``; returns the records."""
    records = bundle_records(bundle, limits)
    for record in records:
        check(record, serve)
    return records


def read_only_environment(base: Path, overlay: Path) -> dict[str, str]:
    """``environment`` for a read-only base: ``VLLM_CACHE_ROOT`` in the writable overlay, its tree mirrored from
    the base's (directories made, files linked): vLLM makes and writes files under the AOT directory after a load
    (``inductor_cache``: Inductor's cache for later compiles), which the base cannot take. Links to base files that
    are gone (a bundle removed from the base while it was writable) are dropped first: the overlay mirrors the base
    as it is, as the overlay's Triton manager reads the base as it is."""
    source = installed_root(base)
    root = overlay / CACHE_ROOT
    _drop_stale_links(root, base / CACHE_ROOT)
    if source is None:
        return {}
    for path in sorted(source.rglob("*")):
        target = root / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.exists() and not target.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    return {"VLLM_CACHE_ROOT": str(root), FORCE: "1"}


def _drop_stale_links(root: Path, source: Path) -> None:
    """Remove the links under ``root`` to files of ``source`` that are gone, and the directories that leaves
    empty (what vLLM wrote in the overlay stays)."""
    if not root.is_dir():
        return
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_symlink() and not path.exists() and Path(os.readlink(path)).is_relative_to(source):
            path.unlink()
            for parent in path.parents:
                if parent == root.parent:
                    break
                try:
                    parent.rmdir()
                except OSError:  # not empty
                    break
