"""Variables as shell ``export`` lines, for ``eval "$(kernelcache env)"`` (standard library only: the pod-start
fast path prints them)."""

from __future__ import annotations

import shlex


def shell_exports(variables: dict[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())
