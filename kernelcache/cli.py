"""The ``kernelcache`` command: a thin click layer over the Python API of the same verbs.

Each command parses its options, calls one API function, and renders the result. Errors the API
raises on purpose (``KernelcacheError``) become one line on stderr and their own exit code; a
fingerprint mismatch also prints the table of differing fields.
"""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from . import __version__
from .errors import FingerprintMismatch, KernelcacheError, UsageError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except FingerprintMismatch as exc:
            _differences_table(exc.differences)
            _fail(exc)
        except KernelcacheError as exc:
            _fail(exc)


def _fail(exc: KernelcacheError) -> None:
    message = " ".join(str(exc).splitlines())  # one line, whatever the cause carried
    err.print(f"kernelcache: error: {message}", markup=False)
    sys.exit(exc.exit_code)


def _differences_table(rows: list[tuple[str, str, str]]) -> None:
    table = Table(title="fingerprint differences", title_justify="left")
    for column in ("field", "bundle", "here"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    err.print(table)


def _json(data) -> None:
    click.echo(json.dumps(data, indent=1))


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kernelcache")
def main() -> None:
    """Prebuilt Triton and FlashInfer caches: build once, install anywhere, compile nothing."""


cache_dir_option = click.option(
    "--cache-dir", type=click.Path(file_okay=False), default=None,
    help="Triton cache dir [default: KERNELCACHE_HOME, TRITON_CACHE_DIR or ~/.triton/cache].",
)
force_option = click.option("--force", is_flag=True, help="Install even if the fingerprint does not match (loud).")


# -- reliability options (issue 6): size limits, read-only base + writable overlay ----------------


def limits_options(func):
    """--max-total / --max-member / --max-members: caps on what a bundle may expand to."""
    for flag, field, what in (("--max-members", "members", "members"),
                              ("--max-member", "member_bytes", "bytes in one member (e.g. 512M)"),
                              ("--max-total", "total_bytes", "bytes in all members (e.g. 8G)")):
        env = f"KERNELCACHE_MAX_{field.upper()}"
        func = click.option(flag, field, default=None, metavar="N",
                            help=f"Refuse a bundle with more than N {what} [env {env}].")(func)
    return func


def make_limits(members: str | None, member_bytes: str | None, total_bytes: str | None):
    from .bundle.archive import Limits, parse_size

    given = {"members": members, "member_bytes": member_bytes, "total_bytes": total_bytes}
    return Limits.from_env(**{k: parse_size(v) for k, v in given.items() if v is not None})


def overlay_options(func):
    """--read-only / --base / --overlay / --miss-log for env and run."""
    func = click.option("--miss-log", type=click.Path(dir_okay=False), default=None,
                        help="JSONL log of misses [default: <overlay>/.kernelcache/misses.jsonl].")(func)
    func = click.option("--overlay", type=click.Path(file_okay=False), default=None,
                        help="Writable dir for misses [default: KERNELCACHE_OVERLAY, else "
                             "$TMPDIR/kernelcache-overlay].")(func)
    func = click.option("--base", type=click.Path(file_okay=False), default=None,
                        help="The read-only installed cache [default: the cache dir].")(func)
    return click.option("--read-only", is_flag=True,
                        help="Serve hits from a read-only base; write misses to an overlay and log them.")(func)


def overlay_variables(read_only: bool, cache_dir: str | None, base: str | None, overlay: str | None,
                      miss_log: str | None) -> dict[str, str] | None:
    """The --read-only environment, or None without --read-only."""
    if not read_only:
        given = [flag for flag, value in (("--base", base), ("--overlay", overlay), ("--miss-log", miss_log)) if value]
        if given:
            raise UsageError(f"{', '.join(given)} only make sense with --read-only")
        return None
    if base is not None and cache_dir is not None:
        raise UsageError("give the read-only cache as --base or as --cache-dir, not both")
    from .runtime.overlay import prepare_overlay

    setup = prepare_overlay(base if base is not None else cache_dir, overlay, miss_log)
    if not setup.bundles:
        err.print(f"warning: {setup.base} holds no kernelcache install receipt; serving it as a plain Triton cache",
                  markup=False)
    return setup.environment()


# -- end of reliability options -------------------------------------------------------------------


@main.command()
@click.argument("cache_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Bundle to write (.tar.zst).")
@click.option("--keep-ir", is_flag=True, help="Also keep the IR files (ttir, ttgir, llir, ptx, source).")
@click.option("--arch", default=None, help="Pack only kernels for this arch (e.g. sm_90).")
@click.option("--compile-log", type=click.Path(dir_okay=False), default=None,
              help="kernelcache compile log with signatures and constexprs.")
def pack(cache_dir: str, output: str, keep_ir: bool, arch: str | None, compile_log: str | None) -> None:
    """Bundle an existing Triton cache directory."""
    from .bundle.inspect import human_size
    from .bundle.make import pack as do_pack

    result = do_pack(cache_dir, output, keep_ir=keep_ir, compile_log=compile_log, arch=arch)
    manifest = result.manifest
    out.print(f"wrote {result.path} ({human_size(result.path.stat().st_size)}): {len(manifest.kernels)} kernels, "
              f"{len(manifest.modules)} modules, target {manifest.target.arch}, digest {result.digest[:16]}")
    for skip in result.skipped:
        err.print(f"skipped {skip['path']}: {skip['reason']}", markup=False)


@main.command()
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(bundle: str, as_json: bool) -> None:
    """Show what a bundle holds: kernels, variants, sizes, target, versions."""
    from .bundle.inspect import human_size
    from .bundle.inspect import inspect as do_inspect

    info = do_inspect(bundle)
    if as_json:
        _json({"digest": info.digest, "compressed_size": info.compressed_size, **info.manifest.to_dict()})
        return
    m = info.manifest
    env = m.environment
    target = f"{m.target.backend} {m.target.arch}" + (f" ({m.target.gpu}, {m.target.sm_count} SMs)"
                                                      if m.target.gpu else "")
    out.print(f"[bold]{info.path.name}[/bold]  digest {info.digest[:16]}  "
              f"{human_size(info.compressed_size)} compressed, {human_size(m.total_size)} installed")
    out.print(f"target {target}; built by {m.build.tool} ({m.build.mode})")
    out.print(f"python {env.python} {env.platform}; triton {env.triton} (key {str(env.triton_key_sha256)[:12]}); "
              f"torch {env.torch}; vllm {env.vllm}; flashinfer {env.flashinfer}; "
              f"key env vars: {env.env_vars or 'none'}")
    table = Table(title_justify="left")
    for column, justify in (("kernel", "left"), ("variants", "right"), ("num_warps", "right"), ("size", "right")):
        table.add_column(column, justify=justify)
    for k in info.kernels:
        table.add_row(k.name, str(k.variants), ",".join(map(str, k.num_warps)), human_size(k.size))
    out.print(table)
    modules = ", ".join(f"{n} {kind}" for kind, n in sorted(info.module_counts.items())) or "none"
    out.print(f"prebuilt modules: {modules}")
    for fi in m.flashinfer:
        out.print(f"flashinfer module {fi.name}: flashinfer {fi.version}, CUDA {fi.cuda}, {' '.join(fi.archs)}")


@main.command()
@click.argument("bundle")
@cache_dir_option
@force_option
@click.option("--no-gpu-check", is_flag=True, help="Do not compare the bundle's arch with the visible GPUs.")
@click.option("--json", "as_json", is_flag=True)
@limits_options
def install(bundle: str, cache_dir: str | None, force: bool, no_gpu_check: bool, as_json: bool,
            members: str | None, member_bytes: str | None, total_bytes: str | None) -> None:
    """Verify a bundle, check it against this environment, and publish it atomically."""
    from .install import install as do_install

    limits = make_limits(members, member_bytes, total_bytes)
    result = do_install(bundle, cache_dir, force=force, check_gpu=not no_gpu_check, limits=limits)
    for warning in result.warnings:
        err.print(f"[bold red]warning:[/bold red] {warning}" if "FORCED" in warning else f"warning: {warning}")
    if as_json:
        _json({"cache_dir": str(result.cache_dir), "digest": result.digest, "action": result.action,
               "written": result.written, "present": result.present, "seconds": result.seconds})
        return
    if result.action == "already-installed":
        out.print(f"already installed in {result.cache_dir} (digest {result.digest[:16]})")
    else:
        out.print(f"installed {result.written} entries into {result.cache_dir} ({result.present} already there) "
                  f"in {result.seconds:.2f}s")


@main.command()
@cache_dir_option
@click.option("--json", "as_json", is_flag=True)
@overlay_options
def env(cache_dir: str | None, as_json: bool, read_only: bool, base: str | None, overlay: str | None,
        miss_log: str | None) -> None:
    """Print shell exports for an installed cache: eval "$(kernelcache env)"."""
    from .runtime.env import prepare, shell_exports

    variables = overlay_variables(read_only, cache_dir, base, overlay, miss_log)
    if variables is None:
        _, variables = prepare(None, cache_dir)
    if as_json:
        _json(variables)
    else:
        click.echo(shell_exports(variables), nl=False)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--bundle", type=click.Path(exists=True, dir_okay=False), default=None, help="Install this first.")
@cache_dir_option
@force_option
@overlay_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(bundle: str | None, cache_dir: str | None, force: bool, read_only: bool, base: str | None,
        overlay: str | None, miss_log: str | None, command: tuple[str, ...]) -> None:
    """Install if needed, then exec COMMAND with the cache active: kernelcache run -- vllm serve ..."""
    from .runtime.env import exec_command
    from .runtime.env import run as do_run

    if read_only and bundle is not None:
        raise UsageError("--read-only serves an installed cache; install --bundle into it first")
    variables = overlay_variables(read_only, cache_dir, base, overlay, miss_log)
    if variables is not None:
        exec_command(list(command), variables)
    do_run(list(command), bundle, cache_dir, force)
