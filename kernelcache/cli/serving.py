"""The pod-start verbs: install, env, run (entry.py runs their plain forms without click, with the same API calls
and the same output)."""

from __future__ import annotations

import click

from ..render import install_summary
from .app import main
from .options import (
    cache_dir_option,
    force_option,
    limits_options,
    make_limits,
    overlay_options,
    signature_options,
)
from .output import err, print_json


@main.command()
@click.argument("bundle")
@cache_dir_option
@force_option
@click.option("--no-gpu-check", is_flag=True, help="Do not compare the bundle's arch with the visible GPUs.")
@click.option("--arch", default=None, help="Install for this arch: picks it from an OCI index, refuses others.")
@click.option("--gpu", default=None, help="Install for this GPU profile (e.g. h200): as --arch, plus SM count.")
@click.option("--serve", default=None, metavar="COMMAND",
              help="The command the server runs ('vllm serve MODEL ...'): a bundle's compile artifact is checked "
                   "against vLLM's hash of it here (default: the bundle's own serve command); exit 23 if it differs.")
@click.option("--json", "as_json", is_flag=True)
@limits_options
@signature_options
def install(bundle: str, cache_dir: str | None, force: bool, no_gpu_check: bool, arch: str | None, gpu: str | None,
            serve: str | None, as_json: bool, members: str | None, member_bytes: str | None,
            total_bytes: str | None, require_signature: bool | None, trusted_keys: tuple[str, ...]) -> None:
    """Verify a bundle, check it against this environment, and publish it atomically.

    BUNDLE is a file, a URL (file://, http(s)://, s3://, ...) or oci://HOST/REPO:TAG. Its signature (B.sig beside a
    file or URL, cosign's sha256-DIGEST.sig tag in a registry) is checked and reported; with --require-signature a
    bundle no trusted key signed is refused before anything is extracted.
    """
    from ..install import install as do_install

    limits = make_limits(members, member_bytes, total_bytes)
    result = do_install(bundle, cache_dir, force=force, check_gpu=not no_gpu_check, limits=limits, arch=arch, gpu=gpu,
                        require_signature=require_signature, trusted_keys=trusted_keys or None, serve=serve)
    _render_install(result.to_dict(), as_json)


def _render_install(result: dict, as_json: bool) -> None:
    for warning in result["warnings"]:  # click, not rich: a no-op install on every pod start renders plain lines only
        forced = "FORCED" in warning
        click.secho(f"warning: {warning}", err=True, fg="red" if forced else None, bold=forced or None)
    click.echo(install_summary(result, as_json))


@main.command()
@cache_dir_option
@click.option("--json", "as_json", is_flag=True)
@overlay_options
def env(cache_dir: str | None, as_json: bool, read_only: bool, base: str | None, overlay: str | None,
        miss_log: str | None) -> None:
    """Print shell exports for an installed cache: eval "$(kernelcache env)"."""
    from ..runtime.env import env as do_env

    found = do_env(cache_dir, read_only=read_only, base=base, overlay=overlay, miss_log=miss_log)
    for warning in found.warnings:
        err.print(f"warning: {warning}", markup=False)
    if as_json:
        print_json(found.variables)
    else:
        click.echo(found.exports(), nl=False)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--bundle", type=click.Path(exists=True, dir_okay=False), default=None, help="Install this first.")
@cache_dir_option
@force_option
@overlay_options
@signature_options
@click.option("--strict", is_flag=True,
              help="Refuse (exit 22) to start a vllm serve command that differs from the installed bundle's serve "
                   "command in a flag that changes kernel keys (without it: a warning).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(bundle: str | None, cache_dir: str | None, force: bool, read_only: bool, base: str | None,
        overlay: str | None, miss_log: str | None, require_signature: bool | None, trusted_keys: tuple[str, ...],
        strict: bool, command: tuple[str, ...]) -> None:
    """Install if needed, then exec COMMAND with the cache active: kernelcache run -- vllm serve ...

    A vllm serve COMMAND is compared with the serve command the installed bundle was built for: a flag that
    changes kernel keys and differs is a warning (--strict: a refusal) before the server starts.
    --require-signature and --trusted-key apply to the --bundle it installs."""
    from ..runtime.env import run as do_run

    do_run(list(command), bundle, cache_dir, force, read_only=read_only, base=base, overlay=overlay,
           miss_log=miss_log, require_signature=require_signature, trusted_keys=trusted_keys or None,
           strict=strict)
