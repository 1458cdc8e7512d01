"""Variables as shell ``export`` lines, for ``eval "$(kernelcache env)"``, and a command exec'd with them (``run``).
Standard library only: the pod-start fast path (entry.py) prints and execs with these."""

from __future__ import annotations

import os
import shlex
import sys

from ..errors import UsageError

TYPE_CHECKING = False  # typing and collections.abc are not imported on the pod-start path
if TYPE_CHECKING:
    from collections.abc import Sequence


def shell_exports(variables: dict[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())


def exec_command(command: Sequence[str], variables: dict[str, str]) -> None:
    """Replace this process with ``command``, its environment updated with ``variables``."""
    if not command:
        raise UsageError("nothing to run: give a command after --")
    env = {**os.environ, **variables}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), env)
    except FileNotFoundError:
        raise UsageError(f"command not found: {command[0]!r}") from None
    except (OSError, ValueError) as exc:  # a directory, not executable, an empty or NUL-holding name
        raise UsageError(f"cannot run {command[0]!r}: {getattr(exc, 'strerror', None) or exc}") from None
