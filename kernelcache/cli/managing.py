"""The verbs on what is installed in a cache dir (or kept in the build cache): ls, rm, prune."""

from __future__ import annotations

import click

from .app import main
from .options import build_cache_option, cache_dir_option, only_one
from .output import err, new_table, out, print_json, show


@main.command()
@cache_dir_option
@build_cache_option("List")
@click.option("--json", "as_json", is_flag=True)
def ls(cache_dir: str | None, build_cache: str | None, as_json: bool) -> None:
    """List the bundles installed in a cache dir: target, fingerprint match, kernels, size, when installed and
    last served, entries shared with other bundles. With --build-cache: its entries and size."""
    from ..manage import ls as do_ls

    if build_cache is not None:
        _ls_build_cache(only_one(cache_dir, build_cache), as_json)
        return
    listing = do_ls(cache_dir)
    for warning in listing.warnings:
        err.print(f"warning: {warning}", markup=False)
    if as_json:
        print_json(listing.to_dict())
    else:
        _render_listing(listing)


def _render_listing(listing) -> None:
    from rich.text import Text

    from ..bundle.inspect import human_size

    table = new_table(title=f"{listing.cache_dir}", title_justify="left")
    for column in ("name", "digest", "target", "matches", "kernels", "tuned", "size", "rm frees", "installed",
                   "last served", "shared", "signed by"):
        table.add_column(column, overflow="fold")
    for b in listing.bundles:
        matches = {True: Text("yes"), False: Text("NO", style="bold red"), None: Text("?")}[b.matches]
        shared = ", ".join(f"{s.entries} with {s.name}" for s in b.shared_with) or "-"
        table.add_row(Text(b.name), b.digest[:12], " ".join(filter(None, (b.arch, b.gpu))), matches, str(b.kernels),
                      Text(_tuned(b)), b.size_on_disk_str, human_size(b.exclusive_size), _when(b.installed_at),
                      _when(b.last_served), Text(shared), Text(_signer(b.signature)))
    show(table)
    for b in listing.bundles:
        if b.serve:
            out.print(f"{b.name}: built for {b.serve} (vLLM config hash {b.config_hash})", markup=False)
        for difference in b.differences:
            out.print(f"{b.name}: {difference}", markup=False)
        if b.missing_files:
            out.print(f"{b.name}: {b.missing_files} installed file(s) missing; install it again", markup=False)
        if b.tuned_on:
            state = b.choices_skipped or f"{b.choices} autotune choice(s) installed"
            out.print(f"{b.name}: tuned on {b.tuned_on}: {state}", markup=False)
        for name in b.flashinfer_modules:
            out.print(f"{b.name}: FlashInfer module {name}", markup=False)
    out.print(f"{len(listing.bundles)} bundle(s), {human_size(listing.size_on_disk)} on disk", markup=False)


def _signer(signature) -> str:
    """``ls``'s column: the signer's fingerprint, and whether it was a trusted key."""
    if not signature.valid:
        return signature.status if signature.status != "unrecorded" else "?"
    trust = "trusted" if signature.status == "trusted" else "not checked against a trusted key"
    return f"{', '.join(s[:19] + '…' for s in signature.signers)} ({trust})"


def _tuned(bundle) -> str:
    """The ``tuned`` cell: the product its choices were timed on (skipped here, when the install left them out)."""
    if not bundle.tuned_on:
        return "-"
    product = bundle.tuned_on.split(" (")[0]
    return f"{product} (skipped)" if bundle.choices_skipped else product


def _ls_build_cache(build_cache: str | None, as_json: bool) -> None:
    from ..bundle.inspect import human_size
    from ..manage import ls_build_cache

    listing = ls_build_cache(build_cache)
    if as_json:
        print_json(listing.to_dict())
        return
    out.print(f"{listing.location}: {listing.entries} entries, {human_size(listing.size_on_disk)} on disk; "
              f"least recently used {_when(listing.oldest_use)}, most recently {_when(listing.newest_use)}",
              markup=False)


def _when(seconds: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds)) if seconds else "-"


@main.command()
@click.argument("bundle")
@cache_dir_option
@click.option("--json", "as_json", is_flag=True)
def rm(bundle: str, cache_dir: str | None, as_json: bool) -> None:
    """Remove an installed BUNDLE (its name as `kernelcache ls` shows it, or its digest) and the entries no other
    installed bundle uses."""
    from ..bundle.inspect import human_size
    from ..manage import rm as do_rm

    result = do_rm(bundle, cache_dir)
    if as_json:
        print_json(result.to_dict())
        return
    gone = result.bundle
    click.echo(f"removed {gone.name} ({gone.digest[:16]}): {len(gone.removed)} entries, {human_size(gone.freed)}; "
               f"{len(gone.kept)} kept (other installed bundles use them)")
    _say_stuck(gone)


def _say_stuck(gone) -> None:
    if gone.stuck:
        err.print(f"warning: {len(gone.stuck)} entries of {gone.name} could not be moved out and stay, whole: "
                  f"{', '.join(gone.stuck[:3])}{' …' if len(gone.stuck) > 3 else ''}", markup=False)


@main.command()
@cache_dir_option
@build_cache_option("Trim")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@click.option("--max-age", type=click.FloatRange(min=0), default=30.0, show_default=True, metavar="DAYS",
              help="Drop served and checked records unused for this many days.")
@click.option("--max-size", default=None, metavar="SIZE",
              help="With --build-cache: remove the least recently used entries until the rest fit SIZE (e.g. 10G).")
@click.option("--json", "as_json", is_flag=True)
def prune(cache_dir: str | None, build_cache: str | None, dry_run: bool, max_age: float, max_size: str | None,
          as_json: bool) -> None:
    """Remove bundles whose fingerprint no longer matches this environment, what interrupted installs left, and
    stale or unused served and checked records. With --build-cache --max-size: trim the build cache."""
    from ..bundle.inspect import human_size
    from ..errors import UsageError
    from ..manage import prune as do_prune

    if build_cache is not None or max_size is not None:
        if build_cache is None or max_size is None:
            raise UsageError("--max-size trims the build cache: give both --build-cache and --max-size")
        _prune_build_cache(only_one(cache_dir, build_cache), max_size, dry_run, as_json)
        return
    result = do_prune(cache_dir, dry_run=dry_run, max_age_days=max_age)
    if as_json:
        print_json(result.to_dict())
        return
    verb = "would remove" if dry_run else "removed"
    for gone in result.bundles:
        why = gone.differences[0] if gone.differences else "fingerprint differs"
        click.echo(f"{verb} {gone.name} ({gone.digest[:16]}): {len(gone.removed)} entries, {human_size(gone.freed)}; "
                   f"{len(gone.kept)} kept (other installed bundles use them); {why}")
        _say_stuck(gone)
    if result.leftovers:
        click.echo(f"{'would finish' if dry_run else 'finished'} what interrupted installs or removals left: "
                   f"{', '.join(result.leftovers)}")
    if result.records:
        click.echo(f"{verb} {len(result.records)} stale or unused record(s)")
    if not (result.bundles or result.leftovers or result.records):
        click.echo(f"nothing to prune in {result.cache_dir}")


def _prune_build_cache(build_cache: str | None, max_size: str, dry_run: bool, as_json: bool) -> None:
    from ..bundle.inspect import human_size
    from ..manage import prune_build_cache

    result = prune_build_cache(max_size, build_cache, dry_run=dry_run)
    if as_json:
        print_json(result.to_dict())
        return
    click.echo(f"{'would remove' if dry_run else 'removed'} {result.removed} least recently used entries "
               f"({human_size(result.freed)}) from {result.location}; {result.entries} entries "
               f"({human_size(result.size_on_disk)}) {'would stay' if dry_run else 'stay'}")
