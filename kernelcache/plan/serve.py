"""The serve command as the plan: ``vllm serve MODEL [flags]`` -> what vLLM configures -> the build's inputs.

A build for a model takes the command its server runs (``kernelcache build --arch sm_90 --gpu h100-sxm --
vllm serve Qwen/Qwen3-8B --max-model-len 32768``, a recipe's ``serve = "..."``, ``build(serve=...)``). The
installed vLLM parses it with its own parser and builds the ``VllmConfig`` a server would build
(exercise/vllm_serve.py, in a child process behind the fake target for each GPU profile); ``ServeConfig`` is what
the build reads from that config: every value that can change a kernel key, and vLLM's own
``VllmConfig.compute_hash()``. The bundle's plan records both, so ``inspect``, ``ls`` and ``run`` can say what a
bundle was built for.

kernelcache's older flags (``--max-num-seqs``, ``--block-size``, ...) with ``--model-config`` are a shorthand:
``shorthand_words`` turns them into the same serve flags, and the same path resolves them.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import UsageError
from . import families

# kernelcache's shorthand flags (PlanOverrides fields) -> vLLM's serve flags; the families' own flags
# (``Family.flags``) follow them. num_speculative_tokens has no plain vLLM flag: it becomes an n-gram
# --speculative-config (a draft method with no model, so no draft weights).
SHORTHAND = {
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "tensor_parallel_size": "--tensor-parallel-size",
    "attention_backend": "--attention-backend",
    "kv_cache_dtype": "--kv-cache-dtype",
    "block_size": "--block-size",
}


@dataclass(frozen=True)
class ServeCommand:
    """``vllm serve MODEL [flags]``, as words (``args``: what follows ``vllm serve``)."""

    args: tuple[str, ...]

    @classmethod
    def parse(cls, command: str | Sequence[str]) -> ServeCommand:
        """A serve command from its text or its words; it must start ``vllm serve`` and name a model."""
        words = shlex.split(command) if isinstance(command, str) else list(command)
        if len(words) < 2 or words[0].rsplit("/", 1)[-1] != "vllm" or words[1] != "serve":
            raise UsageError(f"not a vLLM serve command (it must start 'vllm serve MODEL'): {shlex.join(words)!r}")
        made = cls(tuple(words[2:]))
        if not made.model:
            raise UsageError(f"the serve command names no model: {made.text!r}")
        return made

    @property
    def model(self) -> str:
        """The model: the first positional word, else ``--model``'s value."""
        if self.args and not self.args[0].startswith("-"):
            return self.args[0]
        return self.value("--model") or ""

    def value(self, flag: str) -> str | None:
        """The last value given to ``flag`` (``--flag V`` or ``--flag=V``), None when not given."""
        found = None
        for i, word in enumerate(self.args):
            if word == flag and i + 1 < len(self.args):
                found = self.args[i + 1]
            elif word.startswith(flag + "="):
                found = word.split("=", 1)[1]
        return found

    @property
    def text(self) -> str:
        return shlex.join(["vllm", "serve", *self.args])

    def with_model(self, model: str) -> ServeCommand:
        """The same command with another model path (the local directory holding the hub id's config)."""
        if self.args and not self.args[0].startswith("-"):
            return ServeCommand((model, *self.args[1:]))
        words = list(self.args)
        for i, word in enumerate(words):
            if word == "--model":
                words[i + 1] = model
            elif word.startswith("--model="):
                words[i] = f"--model={model}"
        return ServeCommand(tuple(words))

    def plus(self, words: Sequence[str]) -> ServeCommand:
        return ServeCommand((*self.args, *words))


def shorthand_words(given: dict[str, Any]) -> tuple[str, ...]:
    """kernelcache's flags (``PlanOverrides`` fields that are set, and the families' flags) as vLLM serve flags."""
    words: list[str] = []
    for name, flag in (*SHORTHAND.items(), *((f.name, f.vllm) for f in families.flags())):
        if given.get(name) is not None:
            words += [flag, str(given[name])]
    drafts = given.get("num_speculative_tokens")
    if drafts:
        words += ["--speculative-config", f'{{"method": "ngram", "num_speculative_tokens": {int(drafts)}, '
                                          f'"prompt_lookup_max": 3}}']
    return tuple(words)


@dataclass(frozen=True)
class ServeConfig:
    """What the build reads from the ``VllmConfig`` vLLM built for a serve command on one GPU profile."""

    command: str  # the serve command as given (its model as the user wrote it)
    vllm: str  # the vLLM version that parsed it
    config_hash: str  # VllmConfig.compute_hash()
    architecture: str  # the model class vLLM resolved ("LlamaForCausalLM")
    dtype: str  # ModelConfig.dtype ("bfloat16")
    vocab_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int  # CacheConfig.block_size as configured (before the model's layers are loaded)
    kv_cache_dtype: str
    tensor_parallel_size: int
    attention_backend: str  # the backend vLLM selects for the model's attention on this GPU ("FLASH_ATTN")
    num_speculative_tokens: int = 0
    speculative_method: str = ""
    gdn_prefill_backend: str = "auto"
    enforce_eager: bool = False
    cudagraph_capture_sizes: tuple[int, ...] = ()
    hf_config: dict = field(default_factory=dict)  # the model's config.json, as vLLM read it

    def to_dict(self) -> dict:
        return {**asdict(self), "cudagraph_capture_sizes": list(self.cudagraph_capture_sizes)}

    @classmethod
    def from_dict(cls, data: dict) -> ServeConfig:
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in data.items() if k in known}
        return cls(**{**kept, "cudagraph_capture_sizes": tuple(kept.get("cudagraph_capture_sizes", ()))})

    def keyed(self) -> dict[str, Any]:
        """The values that go into kernel keys (everything but the command, hash, versions and config text)."""
        return {k: v for k, v in self.to_dict().items() if k not in ("command", "vllm", "config_hash", "hf_config")}

    def record(self) -> dict:
        """What a bundle's plan keeps (the config text is the model's own, not the build's); ``served_record`` reads
        it back."""
        return {k: v for k, v in self.to_dict().items() if k != "hf_config"}


def served_record(plan: object) -> dict | None:
    """The serve record a bundle's plan keeps (``plan["serve"]``, ``ServeConfig.record()``), from the plan's JSON (a
    manifest's ``build.plan``, as parsed or as read raw from a receipt); None where the plan has none (a bundle built
    from a recipe's plan alone) or holds something else there. The only reader of that record: ``run``'s comparison
    (runtime/match.py) and ``ls`` / ``inspect`` (manage.py ``built_for``) both read it here."""
    served = plan.get("serve") if isinstance(plan, dict) else None
    return served if isinstance(served, dict) else None
