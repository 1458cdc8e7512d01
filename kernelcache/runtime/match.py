"""Before ``run`` starts a vLLM server: does the command it runs match the serve command the bundle was built for?

A bundle built from a serve command records it with what vLLM configured for it (the plan's ``serve``: max
model len, batch limits, block size, KV-cache dtype, drafts, attention backend, ...). ``run -- vllm serve ...``
compares the command it is about to start with each installed bundle's, flag by flag, for the flags that change
kernel keys (``KEY_FLAGS``): a flag the server sets is compared with the value vLLM derived for the bundle, so
``--max-num-seqs 1024`` matches a bundle built without the flag on a GPU where vLLM's default is 1024. A
difference is a warning on stderr, or with ``--strict`` a refusal (``ServeMismatch``, exit 22) before the server
starts. Commands that are not ``vllm serve`` and bundles built without a serve command are not compared.

Reads the receipts' JSON with the standard library alone (it runs at pod start).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence

from ..cachedir.layout import INSTALLED, state_path
from ..errors import ServeMismatch
from ..plan import families
from ..plan.serve import ServeCommand, served_record

# vLLM serve flag -> the ServeConfig field it sets. --speculative-config is compared by its method and drafts.
KEY_FLAGS = {
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--block-size": "block_size",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--attention-backend": "attention_backend",
    "--tensor-parallel-size": "tensor_parallel_size",
    "--dtype": "dtype",
}  # and each family's flags (``Family.flags``: gdn's --gdn-prefill-backend), by their own names
ALIASES = {"--tensor-parallel-size": "-tp"}
_DTYPES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}


def serve_words(command: Sequence[str]) -> ServeCommand | None:
    """The serve command in ``command`` (``vllm serve ...``, also after ``env``-style wrappers), else None."""
    words = list(command)
    for i in range(len(words) - 1):
        if os.path.basename(words[i]) == "vllm" and words[i + 1] == "serve":
            return ServeCommand(tuple(words[i + 2:]))
    return None


def built_for(root: str | os.PathLike) -> list[dict]:
    """The serve records (``ServeConfig.record()``) of the bundles installed in ``root``."""
    folder = state_path(os.fspath(root), INSTALLED)
    found = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), "rb") as file:
                record = served_record(json.load(file)["manifest"]["build"].get("plan"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if record is not None:
            found.append(record)
    return found


def differences(built: dict, served: ServeCommand) -> list[str]:
    """How the served command differs from the bundle's in flags that change kernel keys, one line each."""
    bundle = ServeCommand.parse(built["command"])
    found = []
    if served.model != bundle.model:
        found.append(f"model {served.model}: the bundle was built for {bundle.model}")
    for flag, field in {**KEY_FLAGS, **{f.vllm: f.name for f in families.flags()}}.items():
        value, theirs = _value(served, flag), _value(bundle, flag)
        if value is None:
            if theirs is not None:
                found.append(f"{flag} not given: the bundle was built with {flag} {theirs} (vLLM's default may differ)")
            continue
        if _same(flag, value, built.get(field, theirs)):
            continue
        found.append(f"{flag} {value}: the bundle was built for {built.get(field, theirs)}")
    return found + _drafts(built, served)


def _value(command: ServeCommand, flag: str) -> str | None:
    value = command.value(flag)
    return value if value is not None or flag not in ALIASES else command.value(ALIASES[flag])


def _same(flag: str, value: str, derived: object) -> bool:
    if flag == "--dtype":
        value = _DTYPES.get(value, value)
        return value in ("auto", str(derived))
    if flag == "--attention-backend":
        return value.upper() == str(derived).upper()
    return value == str(derived)


def _drafts(built: dict, served: ServeCommand) -> list[str]:
    text = served.value("--speculative-config")
    method, drafts = "", 0
    if text:
        try:
            config = json.loads(text)
            method, drafts = str(config.get("method", "")), int(config.get("num_speculative_tokens", 0))
        except (ValueError, TypeError, AttributeError):
            return [f"--speculative-config {text}: not JSON kernelcache can compare"]
    if drafts != int(built.get("num_speculative_tokens", 0) or 0):
        return [f"--speculative-config with {drafts} draft token(s): the bundle was built for "
                f"{built.get('num_speculative_tokens', 0)}"]
    if drafts and method != built.get("speculative_method"):
        return [f"--speculative-config method {method}: the bundle was built for {built.get('speculative_method')}"]
    return []


def check(command: Sequence[str], root: str | os.PathLike, strict: bool = False,
          warn: Callable[[str], None] | None = None) -> list[str]:
    """Compare ``command`` with the serve commands of the bundles installed in ``root``; warn (``warn(line)``, else
    stderr) or, with ``strict``, raise ``ServeMismatch``. Returns the differences (none for a matching bundle)."""
    served = serve_words(command)
    records = built_for(root) if served is not None and served.model else []
    if not records:
        return []
    each = [differences(record, served) for record in records]
    if any(not found for found in each):
        return []  # one installed bundle was built for this command
    closest = min(each, key=len)
    lines = [f"the served command differs from the bundle's ({records[each.index(closest)]['command']}): {line}"
             for line in closest]
    if strict:
        raise ServeMismatch(lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""))
    say = warn or (lambda line: print(f"kernelcache: warning: {line}", file=sys.stderr))
    for line in lines:
        say(line)
    return lines
