"""kernelcache's own cache under the user's: ``$XDG_CACHE_HOME/kernelcache`` (``~/.cache/kernelcache``), one folder
per use, each named once here:

* ``build``: the build cache's default location (buildcache/);
* ``toolchains``: FlashInfer's CUDA toolchain (exercise/flashinfer_sampling.py);
* ``libcuda-stub``: the fake target's driver stub (exercise/fake_target.py);
* ``preflight``: the preflights that passed (preflight.py);
* ``serve``: vLLM's configurations of serve commands and the model configs they read (exercise/vllm_serve.py,
  plan/recipe.py).

Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

FOLDERS = ("build", "toolchains", "libcuda-stub", "preflight", "serve")


def user_cache(folder: str, *parts: str) -> Path:
    """``$XDG_CACHE_HOME/kernelcache/FOLDER/PARTS...`` (``~/.cache/...`` where the variable is unset or empty)."""
    if folder not in FOLDERS:
        raise ValueError(f"not a folder of kernelcache's user cache: {folder!r} (known: {', '.join(FOLDERS)})")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "kernelcache", folder, *parts)
