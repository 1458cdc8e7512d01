"""vLLM's own torch.compile of the served model (enginecompile.py, exercise/vllm_compile.py): the AOT artifact vLLM
saves under ``VLLM_CACHE_ROOT/torch_compile_cache``, built on the fake target with FakeTensor weights, one per GPU
profile. Opt-in (``--path compile``): a dense 8B model takes about 3 minutes of two cores, and it needs the serve
command (vLLM's config hash is the served one's)."""

from __future__ import annotations

from ...errors import RecipeError
from ..family import About, Family, ModelRole, Task
from ..releases import stable

CONTACTS = stable(
    "vllm.compilation.caching:aot_compile_hash_factors", "vllm.compilation.decorators:_model_hash_key",
    "vllm.model_executor.model_loader.utils:initialize_model", "vllm.forward_context:set_forward_context",
    "vllm.engine.arg_utils:AsyncEngineArgs", "vllm", "vllm._custom_ops", "vllm.envs", "vllm.platforms",
    "vllm.config.utils", "vllm.config:set_current_vllm_config", "vllm.compilation.counter:compilation_counter",
    "vllm.usage.usage_lib:UsageContext", "vllm.utils.torch_utils:set_default_torch_dtype")


class TorchCompile(Family):
    """No exercise task: the build runs vLLM's compile itself (enginecompile.py)."""

    name = "compile"
    exercise = "kernelcache.exercise.vllm_compile:build"
    about = About(
        "vLLM's own torch.compile of the served model (the AOT artifact, Inductor's kernels)",
        ("vllm.compilation.decorators", "vLLM's torch.compile support"), reads=("serve",),
        note="opt-in: vLLM's torch.compile", releases=("0.33",),
        lacks="vLLM 0.34's compile cache is keyed otherwise (compile_factors); not built yet", contacts=CONTACTS)
    unit = ""
    model = ModelRole(rank=200)

    def tasks(self, plan, vocab: int) -> tuple[Task, ...]:
        return ()

    def default(self, plan) -> bool:
        return False

    def check(self, plan, where: str) -> None:
        if not plan.serve:
            raise RecipeError(f"{where}: the compile path needs a serve command (build -- vllm serve MODEL ...): "
                              f"vLLM hashes the served config into the artifact's directory")


FAMILY = TorchCompile()
