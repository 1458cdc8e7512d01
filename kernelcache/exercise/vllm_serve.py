"""The ``VllmConfig`` a server builds for a serve command, on a GPU that is not here.

``resolve`` runs ``python -m kernelcache.exercise.vllm_serve REQUEST`` (vLLM's imports stay out of the caller).
The child makes vLLM's platform the named GPU (``TargetPlatform``: vLLM's own ``CudaPlatformBase`` answering the
profile's capability, name, SM count and memory), then does what ``vllm serve`` does before the engine starts:
vLLM's own parser (``ServeSubcommand.subparser_init`` under a ``vllm`` parser, as vllm/entrypoints/cli/main.py
builds it), ``ServeSubcommand.validate``, ``AsyncEngineArgs.from_cli_args`` and
``create_engine_config(UsageContext.OPENAI_API_SERVER)``; then asks vLLM's attention selector
(``get_attn_backend``) which backend the model's attention gets on that GPU. Nothing goes to the network: the
model is a local directory (hub ids are given one by ``--model-config``; plan/recipe.py), with
``HF_HUB_OFFLINE=1``.

Answers are kept under the user cache dir, keyed by the request, the config's bytes and the installed
vLLM/transformers/torch, so a second build of the same command pays no vLLM import. The child also imports the
modules ``imports`` names once its answer is written (as a build's preflight would, preflight.py ``IMPORTABLE``) and
says which imported: a first build then imports vLLM in this one child, not again for its preflight.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MissingDependency, RecipeError, UnknownArchitecture, UsageError
from ..plan.gpus import GpuProfile, memory_mib
from ..plan.serve import ServeCommand, ServeConfig
from ..usercache import user_cache
from .drivers import answering_flash_attn_version, fa_version

EXIT_USAGE, EXIT_ARCHITECTURE, EXIT_MODEL, EXIT_MISSING = 2, 37, 3, 30


@dataclass(frozen=True)
class Resolved:
    configs: dict[str, ServeConfig]  # profile name -> what vLLM configures for the command on it
    imported: tuple[str, ...] = ()  # the modules of ``imports`` the configuring child imported (none: a kept answer)


def resolve(command: ServeCommand, profiles: tuple[GpuProfile, ...], shown: str | None = None,
            imports: Sequence[str] = ()) -> Resolved:
    """What vLLM configures for ``command`` on each profile. ``shown``: the command as the user wrote it (a hub id
    where ``command`` names the local directory holding its config). ``imports``: modules the child also imports,
    after its answer (a failure there is only left out of ``imported``)."""
    _check_model(command.model)
    request = {"args": list(command.args), "shown": shown or command.text,
               "profiles": [{"name": g.name, "arch": g.arch, "product": g.product, "sm_count": g.sm_count,
                             "memory_mib": memory_mib(g)} for g in profiles]}
    kept = _answers_file(request, command.model)
    if kept is not None and kept.is_file():
        return Resolved(_read(json.loads(kept.read_text())))
    answer, imported = _run_child(request, list(imports))
    if kept is not None:
        _keep(kept, answer)
    return Resolved(_read(answer), imported)


def _read(answer: dict) -> dict[str, ServeConfig]:
    return {name: ServeConfig.from_dict(data) for name, data in answer.items()}


def _check_model(model: str) -> None:
    folder = Path(model)
    if not folder.is_dir():
        raise RecipeError(f"{model}: no such model directory (give a local directory holding config.json, or a hub "
                          f"id with --model-config CONFIG.json; nothing is fetched)")
    if not (folder / "config.json").is_file():
        raise RecipeError(f"{model}: the model directory has no config.json (only the config is needed, no weights)")


def _run_child(request: dict, imports: list[str]) -> tuple[dict, tuple[str, ...]]:
    """The child's answer and the modules of ``imports`` it imported."""
    with tempfile.TemporaryDirectory(prefix="kernelcache-serve-") as scratch:
        ask, answer = Path(scratch, "request.json"), Path(scratch, "answer.json")
        imported = Path(scratch, "imported.json")
        ask.write_text(json.dumps({**request, "answer": str(answer), "imports": imports, "imported": str(imported)}))
        # CUDA_VISIBLE_DEVICES="": vllm.triton_utils.importing keeps Triton with no active driver then, as a server
        # with a GPU has it (its config picks Model Runner V2 only with Triton).
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
               "HF_HOME": os.environ.get("HF_HOME", str(Path(scratch, "hf")))}
        done = subprocess.run([sys.executable, "-m", __name__, str(ask)], env=env, capture_output=True, text=True)
        if answer.is_file():  # written once every profile is configured: a crash after it was in the imports
            return json.loads(answer.read_text()), _imported(imported)
        raise _failure(done.returncode, done.stderr)


def _imported(file: Path) -> tuple[str, ...]:
    """The modules the child says imported (it rewrites the list after each): none where it wrote none."""
    try:
        return tuple(json.loads(file.read_text()))
    except (OSError, ValueError):
        return ()


def _failure(code: int, stderr: str) -> Exception:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit {code}"
    if code == EXIT_USAGE:  # argparse's own message: "vllm serve: error: ..."
        said = [line for line in lines if ": error:" in line]
        return UsageError(f"vLLM rejects the serve command: {(said or [last])[-1].strip()}")
    if code == EXIT_ARCHITECTURE:
        return UnknownArchitecture(last)
    if code == EXIT_MODEL:
        return RecipeError(last)
    if code == EXIT_MISSING:
        return MissingDependency(last)
    return UsageError(f"vLLM could not configure the serve command: {last}")


def _answers_file(request: dict, model: str) -> Path | None:
    """Where the answer to ``request`` is kept; None where the installed packages cannot be named."""
    try:
        config = Path(model, "config.json").read_bytes()
        versions = [_dist_digest(name) for name in ("vllm", "transformers", "torch")]
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(("VLLM_", "HF_", "TRANSFORMERS_")))
    # the code that makes the answer: this module (the child) and the record it fills (plan/serve.py)
    code = Path(__file__).read_bytes() + Path(__file__).parents[1].joinpath("plan", "serve.py").read_bytes()
    key = hashlib.sha256(json.dumps([request, versions, env]).encode() + config + code).hexdigest()[:32]
    return user_cache("serve", f"{key}.json")


def _dist_digest(name: str) -> str:
    """A package's version and its installed files' record (a reinstall of the same version changes it)."""
    dist = importlib.metadata.distribution(name)
    record = dist.read_text("RECORD") or ""
    return f"{name}=={dist.version}:{hashlib.sha256(record.encode()).hexdigest()[:16]}"


def _keep(file: Path, answer: dict) -> None:
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        scratch = file.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(answer))
        os.replace(scratch, file)
    except OSError:
        pass  # a read-only home: the next build asks vLLM again


# -- the child ------------------------------------------------------------------------------------------------


PROFILE: dict = {}  # the GPU profile the target platform answers for now (configure swaps it)


def target_platform() -> Any:
    """vLLM's ``CudaPlatformBase`` answering as ``PROFILE``'s GPU does (capability, name, SM count, memory).

    It must be vLLM's platform before vLLM's config modules import: some bind ``current_platform`` at import, so
    one object serves every profile, reading ``PROFILE``. vllm/platforms/cuda.py imports vLLM's stable-ABI
    extension (``vllm._C_stable_libtorch``), which needs the CUDA driver to load; nothing this process calls uses
    it, so an empty module stands in when it cannot load."""
    import types

    try:
        import vllm._C_stable_libtorch  # noqa: F401
    except (ImportError, OSError):
        sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    from vllm.platforms.cuda import CudaPlatformBase
    from vllm.platforms.interface import DeviceCapability

    class TargetPlatform(CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            capability = int(PROFILE["arch"].removeprefix("sm_"))
            return DeviceCapability(capability // 10, capability % 10)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return PROFILE["product"]

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return PROFILE["memory_mib"] * 1024 * 1024

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return PROFILE["sm_count"]

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

    return TargetPlatform()


def _parse(args: list[str]) -> Any:
    """``vllm serve ARGS`` through vLLM's own parser and checks; argparse exits 2 with vLLM's message."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
    except ImportError:  # the server's own modules need its HTTP stack (uvicorn, ...): the same parser without them
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args

        parsed = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(args)
        validate = validate_parsed_serve_args
    else:
        parser = FlexibleArgumentParser(prog="vllm")
        serve = ServeSubcommand()
        serve.subparser_init(parser.add_subparsers(dest="subparser"))
        parsed = parser.parse_args(["serve", *args])
        validate = serve.validate
    if getattr(parsed, "model_tag", None):  # ServeSubcommand.cmd: the positional model wins
        parsed.model = parsed.model_tag
    try:
        validate(parsed)
    except (ValueError, TypeError) as exc:
        print(f"vllm serve: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    return parsed


def configure(args: list[str], profile: dict, shown: str) -> dict:
    """The ``ServeConfig`` (as a dict) vLLM builds for ``vllm serve ARGS`` on ``profile``'s GPU."""
    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.attention.selector import _cached_get_attn_backend

    PROFILE.clear()
    PROFILE.update(profile)
    _inspect_here()
    capability_answers()
    _cached_get_attn_backend.cache_clear()  # its answer was for the last profile's capability
    parsed = _parse(args)
    try:
        config = AsyncEngineArgs.from_cli_args(parsed).create_engine_config(UsageContext.OPENAI_API_SERVER)
    except Exception as exc:  # noqa: BLE001 - vLLM raises ValueError or pydantic's ValidationError
        _refuse(exc)
    model, cache, scheduler = config.model_config, config.cache_config, config.scheduler_config
    # ModelConfig.compute_hash keeps the model string: the server's is the one the user wrote (a hub id), not
    # the folder its config was read from here.
    model.model = ServeCommand.parse(shown).model
    spec = config.speculative_config
    compilation = config.compilation_config
    return ServeConfig(
        command=shown, vllm=vllm.__version__, config_hash=config_hash(config),
        architecture=model.architecture, dtype=str(model.dtype).removeprefix("torch."),
        vocab_size=model.get_vocab_size(), max_model_len=model.max_model_len, max_num_seqs=scheduler.max_num_seqs,
        max_num_batched_tokens=scheduler.max_num_batched_tokens, block_size=cache.block_size,
        kv_cache_dtype=str(cache.cache_dtype), tensor_parallel_size=config.parallel_config.tensor_parallel_size,
        attention_backend=_attention_backend(config),
        num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
        speculative_method=str(spec.method) if spec else "",
        gdn_prefill_backend=_gdn_prefill_backend(config),
        enforce_eager=bool(model.enforce_eager),
        cudagraph_capture_sizes=tuple(compilation.cudagraph_capture_sizes or ()),
        hf_config=model.hf_config.to_dict(),
    ).to_dict()


def config_hash(config: Any) -> str:
    """vLLM's hash of the config, as its compile cache keys it: ``VllmConfig.compute_hash()`` (0.33), else
    ``hash_factors(VllmConfig.compile_factors())`` (0.34, vllm/compilation/caching.py
    ``compute_env_and_config_hashes``)."""
    if hasattr(config, "compute_hash"):
        return config.compute_hash()
    from vllm.config.utils import hash_factors

    return hash_factors(config.compile_factors())


def _inspect_here() -> None:
    """vLLM's model registry inspects a model class in a fresh interpreter (``registry._run_in_subprocess``, so that
    the server's process does not initialise CUDA), where kernelcache's target platform is not vLLM's; this process
    is itself a throwaway one without CUDA, so the same inspection runs here."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


def _refuse(exc: Exception) -> None:
    import re

    import vllm

    text = " ".join(str(exc).split())
    unknown = re.search(r"architectures? (\[[^\]]*\]) (?:are|is) not supported", text)
    if unknown:
        print(f"the model's architecture {unknown.group(1)} is not one the installed vllm {vllm.__version__} knows "
              f"(ModelConfig refused it); nothing was built", file=sys.stderr)
        raise SystemExit(EXIT_ARCHITECTURE) from None
    print(f"vllm serve: error: {text[:600]}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE) from None


def _attention_backend(config: Any) -> str:
    """The backend vLLM's selector gives the model's attention on this GPU (the named one when given)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    named = getattr(config.attention_config, "backend", None)
    if named is not None:
        return getattr(named, "name", str(named))
    model = config.model_config
    try:
        with set_current_vllm_config(config), answering_flash_attn_version(served_fa_version()):
            backend = get_attn_backend(model.get_head_size(), model.dtype, config.cache_config.cache_dtype,
                                       has_sliding_window=bool(model.get_sliding_window()))
    except Exception as exc:  # noqa: BLE001 - a model with no plain attention (attention-free, MLA): the default
        print(f"kernelcache: no attention backend selected ({exc}); the build takes vLLM's default", file=sys.stderr)
        return "auto"
    return backend.get_name()


def served_fa_version() -> int:
    """``fa_version`` of ``PROFILE``'s GPU."""
    return fa_version(int(PROFILE["arch"].removeprefix("sm_")) // 10)


def flash_attn_interface() -> None:
    """vLLM's FlashAttention wrapper (``vllm.vllm_flash_attn``) refuses to import without its compiled CUDA
    extensions, which a server has; the model's modules import it, and the selector asks it which FlashAttention
    version runs. Where it cannot import, a stand-in answers that (``served_fa_version``) and refuses any call."""
    import types

    try:
        import vllm.vllm_flash_attn  # noqa: F401
        return
    except ImportError:
        pass

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("FlashAttention's kernels are not loaded in kernelcache's configuration process")

    names = {"compile_flash_attn_varlen_func_from_specs": None, "flash_attn_varlen_func": unavailable,
             "get_scheduler_metadata": unavailable, "is_fa_version_supported": lambda v: v == served_fa_version(),
             "fa_version_unsupported_reason": lambda v: None if v == served_fa_version() else "not on this GPU",
             "FA2_AVAILABLE": True, "FA3_AVAILABLE": True}
    for name in ("vllm.vllm_flash_attn", "vllm.vllm_flash_attn.flash_attn_interface"):
        module = types.ModuleType(name)
        module.__dict__.update(names)
        sys.modules[name] = module


def capability_answers() -> None:
    """vLLM's model modules ask its compiled ops at import which CUTLASS FP8 GEMMs the GPU has
    (``_custom_ops.cutlass_scaled_mm_supports_fp8`` / ``..._block_fp8``, csrc/quantization/w8a8/cutlass/
    scaled_mm_entry.cu: FP8 from sm_89, block FP8 from sm_90); where those ops are not loaded (no CUDA driver here),
    the same answers come from the profile's capability."""
    import torch
    from vllm import _custom_ops

    capability = int(PROFILE["arch"].removeprefix("sm_"))
    answers = {"cutlass_scaled_mm_supports_fp8": lambda cap=capability: cap >= 89,
               "cutlass_scaled_mm_supports_block_fp8": lambda cap=capability: cap >= 90}
    for name, answer in answers.items():
        if not hasattr(torch.ops._C, name) and hasattr(_custom_ops, name):
            setattr(_custom_ops, name, lambda cuda_device_capability=0, answer=answer: answer())


def _gdn_prefill_backend(config: Any) -> str:
    """As ``_resolve_gdn_prefill_backend`` (vLLM's gated-delta-net layer) reads it: ``additional_config``'s
    ``gdn_prefill_backend`` (``--gdn-prefill-backend``), else auto."""
    extra = config.additional_config
    return str(extra.get("gdn_prefill_backend", "auto") if isinstance(extra, dict) else "auto").strip().lower()


def main(request_file: str) -> int:
    request = json.loads(Path(request_file).read_text())
    try:
        import vllm.platforms
    except ImportError as exc:
        print(f"vLLM is not importable here ({exc}): install the vLLM release the server runs", file=sys.stderr)
        return EXIT_MISSING
    PROFILE.update(request["profiles"][0])
    vllm.platforms._current_platform = target_platform()  # before vLLM's config modules import
    flash_attn_interface()
    answer = {p["name"]: configure(request["args"], p, request["shown"]) for p in request["profiles"]}
    Path(request["answer"]).write_text(json.dumps(answer))
    import_each(request.get("imports", []), Path(request["imported"]))
    return 0


def import_each(modules: list[str], report: Path) -> None:
    """Import each of ``modules`` (preflight.py's row asks the same of a fresh child), listing in ``report`` those
    that imported, rewritten after each: one that kills the process leaves the ones before it said."""
    import importlib

    done: list[str] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 -- the preflight's own child reports it, with its error
            continue
        done.append(name)
        scratch = report.with_suffix(".tmp")
        scratch.write_text(json.dumps(done))
        os.replace(scratch, report)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
