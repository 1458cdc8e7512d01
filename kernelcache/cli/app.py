"""The ``kernelcache`` group: its errors become one line on stderr and their own exit code (a fingerprint mismatch
also prints the table of differing fields), a closed pipe exits 0, Ctrl-C exits 130."""

from __future__ import annotations

import signal
import sys

import click

from ..errors import FingerprintMismatch, KernelcacheError, StorageError
from ..version import __version__
from .output import closed_pipe, err, new_table, show


class Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            closed_pipe()
        except (KernelcacheError, OSError) as exc:
            fail(exc)
        except KeyboardInterrupt:
            err.print("kernelcache: interrupted", markup=False)
            sys.exit(130)


def fail(exc: KernelcacheError | OSError) -> None:
    """Say why a command failed and exit with its code (the entry point's plain forms end here too)."""
    if isinstance(exc, FingerprintMismatch):
        _differences_table(exc.differences)
    if isinstance(exc, OSError):  # a file-system error no command mapped itself: still one line, exit 40
        where = f"{exc.filename}: " if exc.filename else ""
        exc = StorageError(f"{where}{exc.strerror or exc}")
    _fail(exc)


def _fail(exc: KernelcacheError) -> None:
    message = " ".join(str(exc).splitlines())  # one line, whatever the cause carried
    err.print(f"kernelcache: error: {message}", markup=False)
    sys.exit(exc.exit_code)


def terminate_cleanly() -> None:
    """SIGTERM (a pod stop, ``timeout``) unwinds like Ctrl-C, so temp dirs and child processes go too.

    Only for build / capture / verify: an install stays as SIGKILL-safe as it is, untouched."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def _differences_table(rows: list[tuple[str, str, str]]) -> None:
    from rich.text import Text

    table = new_table(title="fingerprint differences", title_justify="left")
    for column in ("field", "bundle", "here"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # plain text: "ptxas[sm_90]" is not markup
    show(table, err)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kernelcache")
def main() -> None:
    """Prebuilt Triton and FlashInfer caches: build once, install anywhere, compile nothing."""
