"""The ``kernelcache`` command: a thin click layer over the Python API of the same verbs.

Each command parses its options, calls one API function, and renders the result. Errors the API
raises on purpose (``KernelcacheError``) become one line on stderr and their own exit code; a
fingerprint mismatch also prints the table of differing fields.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from typing import Any

import click

from .errors import FingerprintMismatch, KernelcacheError, StorageError
from .version import __version__


class LazyConsole:
    """rich's ``Console``, made on first use: importing rich takes 20-30 ms that ``env``, ``run`` and a
    no-op ``install`` (on every pod start) never need."""

    def __init__(self, stderr: bool = False):
        self._stderr = stderr
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console(), name)

    def console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            class Quiet(Console):
                def on_broken_pipe(self) -> None:  # rich's exits 1
                    closed_pipe()

            self._console = Quiet(stderr=self._stderr, highlight=False, soft_wrap=True)
        return self._console


out = LazyConsole()
err = LazyConsole(stderr=True)


def _table(**options: Any):
    from rich.table import Table

    return Table(**options)


def show(table: Any, console: LazyConsole = out) -> None:
    """A rich table on a terminal wide enough for every row on one line; else (piped, logged, narrow) one plain row
    per item, cells whole, in columns two spaces apart, as ``pip list`` and ``docker images`` print: a script, a
    log or ``ls | grep NAME`` reads each name whole."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(1 << 20)  # the width every row takes on one line
    if console.is_terminal and Measurement.get(console.console(), unbounded, table).maximum <= console.width:
        console.print(table)
        return
    for line in plain_rows(table):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def plain_rows(table: Any) -> list[str]:
    """The title, the header (where the table shows one) and each row of a rich table, as plain text lines."""
    from rich.text import Text

    def plain(cell: Any) -> str:
        text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
        return " ".join(text.split())

    columns = [[plain(c.header), *map(plain, c.cells)] for c in table.columns]
    if not columns:
        return []
    rows = list(zip(*columns, strict=True))[0 if table.show_header else 1:]
    widths = [max(map(len, column)) for column in columns]
    lines = ["  ".join(cell.ljust(w) if c.justify != "right" else cell.rjust(w)
                       for cell, w, c in zip(row, widths, table.columns, strict=True)).rstrip() for row in rows]
    title = plain(table.title) if table.title else ""
    return [title, *lines] if title else lines


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


def closed_pipe() -> None:
    """Whoever read stdout stopped reading (``inspect B | head -1``): what was asked for is done, so exit 0 and say
    nothing, as ``git log | head -1`` leaves the pipeline's status to its reader; stdout goes to /dev/null first, so
    the interpreter's last flush of the closed pipe raises nothing."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)


def _terminate_cleanly() -> None:
    """SIGTERM (a pod stop, ``timeout``) unwinds like Ctrl-C, so temp dirs and child processes go too.

    Only for build / capture / verify: an install stays as SIGKILL-safe as it is, untouched."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def _fail(exc: KernelcacheError) -> None:
    message = " ".join(str(exc).splitlines())  # one line, whatever the cause carried
    err.print(f"kernelcache: error: {message}", markup=False)
    sys.exit(exc.exit_code)


def _differences_table(rows: list[tuple[str, str, str]]) -> None:
    from rich.text import Text

    table = _table(title="fingerprint differences", title_justify="left")
    for column in ("field", "bundle", "here"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # plain text: "ptxas[sm_90]" is not markup
    show(table, err)


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


def signature_options(func):
    """--require-signature / --trusted-key: the signature policy of an install (bundle/trust.py)."""
    func = click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(dir_okay=False),
                        help="A trusted public key (PEM; repeatable) [env KERNELCACHE_TRUSTED_KEYS, ':'-separated]."
                        )(func)
    return click.option("--require-signature", is_flag=True, default=None,
                        help="Refuse a bundle that no trusted key signed [env KERNELCACHE_REQUIRE_SIGNATURE=1].")(func)


def sign_option(what: str):
    return click.option("--sign", "sign_key", type=click.Path(dir_okay=False), default=None,
                        help=f"Sign {what} with this private key (PEM: ed25519 or ECDSA P-256).")


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
    from .format.archive import Limits, parse_size

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


class PathOption(click.Option):
    """``--path``: its help lists the families the registry (plan/families/) holds when help is shown."""

    def get_help_record(self, ctx: click.Context):
        from .plan.families import path_help

        self.help = path_help()
        return super().get_help_record(ctx)


def plan_options(recipe_help: str):
    """The options ``build`` and ``verify`` share: a recipe, the flags that override its plan (handed on as
    one ``PlanOverrides``, the ``overrides`` argument), and how the exercise processes run."""
    options = (
        click.option("--recipe", "--manifest", "recipe", type=click.Path(dir_okay=False), default=None,
                     metavar="NAME|FILE",
                     help=recipe_help + " (--manifest: its old name)"),
        click.option("--gpu", "gpus", multiple=True, help="GPU profile(s) (overrides the recipe's list)."),
        click.option("--vocab", "vocabs", multiple=True, type=int, help="Vocab size(s) (overrides the recipe)."),
        click.option("--dtype", "dtypes", multiple=True,
                     help="Model / logits dtype(s): float32 (what registry and mrv1 need), bfloat16, float16; "
                          "moe runs in the ones other than float32."),
        click.option("--max-num-seqs", type=int, default=None, help="vLLM max_num_seqs (the batch range)."),
        click.option("--path", "paths", multiple=True, cls=PathOption),
        click.option("--model-config", type=click.Path(dir_okay=False), default=None,
                     help="A local Hugging Face config.json: its vocab, dtype, MoE / attention / Mamba-2 / "
                          "gated-delta-net layers, its name for the bundle."),
        click.option("--max-num-batched-tokens", type=int, default=None,
                     help="vLLM max_num_batched_tokens (moe: every token count up to it)."),
        click.option("--tensor-parallel-size", type=int, default=None,
                     help="vLLM tensor_parallel_size (moe: each GPU's share of an expert)."),
        click.option("--num-speculative-tokens", type=int, default=None,
                     help="vLLM num_speculative_tokens: drafts per request (the spec-decode paths, and the batch "
                          "range)."),
        click.option("--max-model-len", type=int, default=None,
                     help="vLLM max_model_len (spec decode, runner, attention: block-table widths)."),
        click.option("--attention-backend", default=None,
                     help="vLLM --attention-backend: TRITON_ATTN adds the attention path (vLLM's Triton backend), "
                          "FLASHINFER the flashinfer_attention path (FlashInfer's JIT modules); auto and "
                          "FLASH_ATTN compile no attention kernel."),
        click.option("--kv-cache-dtype", default=None, help="vLLM --kv-cache-dtype: auto (the model's), fp8, "
                                                            "fp8_e4m3, fp8_e5m2 (the attention path: auto only)."),
        click.option("--block-size", type=int, default=None, help="vLLM --block-size: tokens per KV-cache block "
                                                                  "(runner, attention) [default: 16]."),
        click.option("--gdn-prefill-backend", default=None,
                     help="vLLM --gdn-prefill-backend (gdn): auto (vLLM's choice: FlashInfer's CUDA module on "
                          "Hopper), triton (the FLA Triton kernels), flashinfer."),
        click.option("--mode", type=click.Choice(["auto", "cross", "native"]), default="auto", show_default=True,
                     help="native: run on a visible GPU of the arch; cross: a faithful fake target; "
                          "auto: native if possible."),
        click.option("--jobs", type=click.IntRange(min=1), default=None,
                     help="Exercise processes at once [default: all cores]."),
    )

    def decorate(func):
        @functools.wraps(func)
        def command(*args, gpus, vocabs, dtypes, max_num_seqs, paths, num_speculative_tokens, max_model_len,
                    model_config, max_num_batched_tokens, tensor_parallel_size, attention_backend, kv_cache_dtype,
                    block_size, gdn_prefill_backend, **kwargs):
            from .plan.recipe import PlanOverrides

            overrides = PlanOverrides(
                gpus=gpus, vocabs=vocabs, dtypes=dtypes, max_num_seqs=max_num_seqs, paths=paths,
                num_speculative_tokens=num_speculative_tokens, max_model_len=max_model_len, model_config=model_config,
                max_num_batched_tokens=max_num_batched_tokens, tensor_parallel_size=tensor_parallel_size,
                attention_backend=attention_backend, kv_cache_dtype=kv_cache_dtype, block_size=block_size,
                gdn_prefill_backend=gdn_prefill_backend)
            return func(*args, overrides=overrides, **kwargs)

        for option in reversed(options):
            command = option(command)
        return command

    return decorate


# -- end of reliability options -------------------------------------------------------------------


@main.command()
@click.argument("cache_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Bundle to write (.tar.zst).")
@click.option("--keep-ir", is_flag=True, help="Also keep the IR files (ttir, ttgir, llir, ptx, source).")
@click.option("--arch", default=None, help="Pack only kernels for this arch (e.g. sm_90).")
@click.option("--compile-log", type=click.Path(exists=True, dir_okay=False), default=None,
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
    from .manage import built_for

    info = do_inspect(bundle)
    if as_json:
        _json(info.to_dict())
        return
    signature = info.signature.describe()
    m = info.manifest
    env = m.environment
    target = f"{m.target.backend} {m.target.arch}" + (f" ({m.target.gpu}, {m.target.sm_count} SMs)"
                                                      if m.target.gpu else "")
    out.print(f"[bold]{info.path.name}[/bold]  digest {info.digest[:16]}  "
              f"{human_size(info.compressed_size)} compressed, {human_size(m.total_size)} installed")
    out.print(f"target {target}; built by {m.build.tool} ({m.build.mode})")
    command, config_hash = built_for(m)
    if command:
        out.print(f"built for: {command} (vLLM config hash {config_hash})", markup=False)
    keys = m.device_keys
    if keys is not None:
        tables = ", ".join(f"{t.path}: {t.file or 'default config'}" for t in keys.tables) or "not recorded"
        out.print(f"kernels chosen by device name {keys.device} ({tables}); serves {', '.join(keys.serves)}")
    out.print(f"signature: {signature}", markup=False)
    out.print(f"python {env.python} {env.platform}; triton {env.triton} (key {str(env.triton_key_sha256)[:12]}); "
              f"torch {env.torch}; vllm {env.vllm}; flashinfer {env.flashinfer}; "
              f"key env vars: {env.env_vars or 'none'}")
    table = _table(title_justify="left")
    for column, justify in (("kernel", "left"), ("variants", "right"), ("num_warps", "right"), ("size", "right")):
        table.add_column(column, justify=justify)
    for k in info.kernels:
        table.add_row(k.name, str(k.variants), ",".join(map(str, k.num_warps)), human_size(k.size))
    show(table)
    modules = ", ".join(f"{n} {kind}" for kind, n in sorted(info.module_counts.items())) or "none"
    out.print(f"prebuilt modules: {modules}")
    for fi in m.flashinfer:
        out.print(f"flashinfer module {fi.name}: flashinfer {fi.version}, CUDA {fi.cuda}, {' '.join(fi.archs)}, "
                  f"tvm-ffi {fi.tvm_ffi}")
    out.print(_tuning_line(m.tuning), markup=False)


def _tuning_line(tuning) -> str:
    """Whether a bundle carries autotune choices, for which kernels, and where they were timed."""
    if tuning is None:
        return "autotune choices: none (kernelcache tune times them on a GPU of the bundle's profile)"
    names = sorted(set(tuning.kernels()))
    return (f"autotune choices: {len(tuning.files)} for {len(names)} kernel(s) ({', '.join(names)}), "
            f"timed on {tuning.where()}")


@main.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--key", required=True, type=click.Path(dir_okay=False),
              help="The private key (PEM, unencrypted: ed25519 or ECDSA P-256).")
@click.option("--json", "as_json", is_flag=True)
def sign(bundles: tuple[str, ...], key: str, as_json: bool) -> None:
    """Sign bundle files: verify each, then write B.tar.zst.sig beside it (a detached signature over its sha256 and
    its digest)."""
    from .bundle.signature import load_signing_key
    from .bundle.signature import sign as do_sign

    signer = load_signing_key(key)  # a bad key fails before any bundle is read
    results = [do_sign(bundle, signer) for bundle in bundles]
    if as_json:
        _json([r.to_dict() for r in results])
        return
    for r in results:
        out.print(f"signed {r.bundle.name} (sha256 {r.sha256[:16]}…, digest {r.digest[:16]}) with {r.algorithm} key "
                  f"{r.signer[:19]}… -> {r.signature}", markup=False)


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
    from .install import install as do_install

    limits = make_limits(members, member_bytes, total_bytes)
    result = do_install(bundle, cache_dir, force=force, check_gpu=not no_gpu_check, limits=limits, arch=arch, gpu=gpu,
                        require_signature=require_signature, trusted_keys=trusted_keys or None, serve=serve)
    _render_install(result.to_dict(), as_json)


def _render_install(result: dict, as_json: bool) -> None:
    from .bundle.trust import said

    for warning in result["warnings"]:  # click, not rich: a no-op install on every pod start renders plain lines only
        forced = "FORCED" in warning
        click.secho(f"warning: {warning}", err=True, fg="red" if forced else None, bold=forced or None)
    if as_json:
        _json({k: v for k, v in result.items() if k != "warnings"})
        return
    signed = said(result.get("signature"))
    tuned = "; autotune choices installed" if result.get("choices") == "installed" else ""
    if result["action"] == "already-installed":
        click.echo(f"already installed in {result['cache_dir']} (digest {result['digest'][:16]}){signed}{tuned}")
    else:
        click.echo(f"installed {result['written']} entries into {result['cache_dir']} ({result['present']} already "
                   f"there) in {result['seconds']:.2f}s{signed}{tuned}")


@main.command()
@cache_dir_option
@click.option("--json", "as_json", is_flag=True)
@overlay_options
def env(cache_dir: str | None, as_json: bool, read_only: bool, base: str | None, overlay: str | None,
        miss_log: str | None) -> None:
    """Print shell exports for an installed cache: eval "$(kernelcache env)"."""
    from .runtime.env import env as do_env

    found = do_env(cache_dir, read_only=read_only, base=base, overlay=overlay, miss_log=miss_log)
    for warning in found.warnings:
        err.print(f"warning: {warning}", markup=False)
    if as_json:
        _json(found.variables)
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
    from .runtime.env import run as do_run

    do_run(list(command), bundle, cache_dir, force, read_only=read_only, base=base, overlay=overlay,
           miss_log=miss_log, require_signature=require_signature, trusted_keys=trusted_keys or None,
           strict=strict)


# -- cache management: what is installed in a cache dir ---------------------------------------------


def build_cache_option(what: str):
    """``--build-cache [DIR]``: act on the build cache (the default one without DIR) instead of a cache dir."""
    return click.option("--build-cache", "build_cache", is_flag=False, flag_value="", default=None, metavar="[DIR]",
                        help=f"{what} the build cache (DIR, else the one `build` uses) instead of a cache dir.")


def _only_one(cache_dir: str | None, build_cache: str | None) -> str | None:
    """The build cache asked for (None: the default one), after refusing it together with --cache-dir."""
    from .errors import UsageError

    if cache_dir is not None:
        raise UsageError("--cache-dir and --build-cache exclude each other")
    return build_cache or None


@main.command()
@cache_dir_option
@build_cache_option("List")
@click.option("--json", "as_json", is_flag=True)
def ls(cache_dir: str | None, build_cache: str | None, as_json: bool) -> None:
    """List the bundles installed in a cache dir: target, fingerprint match, kernels, size, when installed and
    last served, entries shared with other bundles. With --build-cache: its entries and size."""
    from .manage import ls as do_ls

    if build_cache is not None:
        _ls_build_cache(_only_one(cache_dir, build_cache), as_json)
        return
    listing = do_ls(cache_dir)
    for warning in listing.warnings:
        err.print(f"warning: {warning}", markup=False)
    if as_json:
        _json(listing.to_dict())
    else:
        _render_listing(listing)


def _render_listing(listing) -> None:
    from rich.text import Text

    from .bundle.inspect import human_size

    table = _table(title=f"{listing.cache_dir}", title_justify="left")
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
    from .bundle.inspect import human_size
    from .manage import ls_build_cache

    listing = ls_build_cache(build_cache)
    if as_json:
        _json(listing.to_dict())
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
    from .bundle.inspect import human_size
    from .manage import rm as do_rm

    result = do_rm(bundle, cache_dir)
    if as_json:
        _json(result.to_dict())
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
    from .bundle.inspect import human_size
    from .errors import UsageError
    from .manage import prune as do_prune

    if build_cache is not None or max_size is not None:
        if build_cache is None or max_size is None:
            raise UsageError("--max-size trims the build cache: give both --build-cache and --max-size")
        _prune_build_cache(_only_one(cache_dir, build_cache), max_size, dry_run, as_json)
        return
    result = do_prune(cache_dir, dry_run=dry_run, max_age_days=max_age)
    if as_json:
        _json(result.to_dict())
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
    from .bundle.inspect import human_size
    from .manage import prune_build_cache

    result = prune_build_cache(max_size, build_cache, dry_run=dry_run)
    if as_json:
        _json(result.to_dict())
        return
    click.echo(f"{'would remove' if dry_run else 'removed'} {result.removed} least recently used entries "
               f"({human_size(result.freed)}) from {result.location}; {result.entries} entries "
               f"({human_size(result.size_on_disk)}) {'would stay' if dry_run else 'stay'}")


@main.command()
@click.option("--arch", required=True, help="Target GPU arch, e.g. sm_90 or sm_100.")
@plan_options("Build recipe: a shipped recipe's name (kernelcache recipes) or a TOML file [default: "
              "vllm-sampler].")
@click.option("-o", "--output-dir", default="bundles", show_default=True, type=click.Path(file_okay=False))
@click.option("--keep-ir", is_flag=True, help="Also keep the IR files.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None, help="Keep the build's scratch dir here.")
@click.option("--from-misses", "miss_logs", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Also compile the misses an overlay logged (kernelcache run --read-only).")
@click.option("--target-env", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Fingerprint of the serving environment (kernelcache fingerprint --json there): refuse, before "
                   "compiling, a bundle its install would refuse.")
@click.option("--build-cache", "build_cache", default=None, metavar="DIR|URL",
              help="Take kernels earlier builds compiled from here and add what this one compiles: a directory, "
                   "oci://HOST/REPOSITORY or an fsspec URL (s3://, gs://, file://) [default: $KERNELCACHE_BUILD_CACHE, "
                   "else ~/.cache/kernelcache/build].")
@click.option("--no-build-cache", is_flag=True, help="Compile everything; read and write no build cache.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@sign_option("each bundle (B.tar.zst.sig beside it)")
@click.argument("serve", nargs=-1, type=click.UNPROCESSED, metavar="[-- vllm serve MODEL [FLAGS]]")
def build(arch, recipe, overrides, mode, jobs, output_dir, keep_ir, workdir, miss_logs, target_env, build_cache,
          no_build_cache, as_json, sign_key, serve) -> None:
    """Build the kernels a vLLM server runs on ARCH into one bundle per GPU profile.

    \b
    For a model, give the command the server runs, after --:
      kernelcache build --arch sm_90 --gpu h100-sxm -- vllm serve Qwen/Qwen3-8B --max-model-len 32768
    The installed vLLM parses it with its own parser and configures it as a server on each GPU profile would
    (limits, block size, KV-cache dtype, drafts, attention backend); the bundle records the command and vLLM's
    config hash. MODEL is a local directory holding config.json, or a hub id with --model-config CONFIG.json (or
    one kernelcache ships a config for); nothing is fetched. Without a serve command: a recipe's plan (the sampler
    paths for its vocab sizes by default)."""
    from dataclasses import replace

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .build import build as do_build
    from .errors import UsageError

    if serve:
        overrides = replace(overrides, serve=serve)

    if build_cache is not None and no_build_cache:
        raise UsageError("--build-cache and --no-build-cache exclude each other")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    _terminate_cleanly()
    # A bar only on a terminal: piped stderr (CI logs) keeps its one-line errors.
    with Progress(*columns, console=err.console(), transient=True, disable=as_json or not err.is_terminal) as bar:
        tasks: dict[str, int] = {}

        def progress(label: str, done: int, total: int) -> None:
            if not err.is_terminal and not as_json and done:  # a log gets a line per finished process
                err.print(f"{label}: {done}/{total} exercise processes done", markup=False)
            if label not in tasks:
                tasks[label] = bar.add_task(f"exercising {label}", total=total)
            bar.update(tasks[label], completed=done)

        result = do_build(arch, recipe, overrides, mode=mode, jobs=jobs, output_dir=output_dir, keep_ir=keep_ir,
                          workdir=workdir, progress=progress, from_misses=list(miss_logs), target_env=target_env,
                          sign=sign_key, build_cache=False if no_build_cache else build_cache)
    if as_json:
        _json([t.to_dict() for t in result.targets])
        return
    for target in result.targets:
        _build_summary(target)


def _build_summary(target) -> None:
    from .bundle.inspect import human_size

    t = target.target
    table = _table(title=f"{t.arch}, {t.sm_count} SMs ({t.mode})", title_justify="left")
    for column in ("kernel", "variants", "by path"):
        table.add_column(column)
    for name, cov in target.coverage.items():
        table.add_row(name, str(cov["variants"]), ", ".join(f"{p} {n}" for p, n in cov["by_path"].items()))
    if target.coverage:
        show(table)
    first = target.bundles[0].manifest
    flashinfer = "".join(f", FlashInfer {m.name} ({' '.join(m.archs)})" for m in first.flashinfer)
    out.print(f"{len(first.kernels)} kernels, {len(first.modules)} prebuilt modules{flashinfer}; {target.compiles} "
              f"compiles ({target.compile_seconds:.1f}s of compile time) in {target.seconds:.1f}s")
    for skip in target.skipped:
        if skip["path"].startswith("flashinfer/"):
            out.print(f"left out {skip['path']}: {skip['reason']}", markup=False)
    cache = target.build_cache
    if cache.location:
        out.print(f"build cache {cache.location}: {cache.reused} kernels and {cache.reused_modules} modules reused, "
                  f"{cache.published} entries added" + (f", {cache.corrupt} corrupt ones compiled again"
                                                         if cache.corrupt else "")
                  + (f"; FlashInfer's module {cache.flashinfer}" if cache.flashinfer else "")
                  + (f"; {cache.bundles} compressed bundle(s) reused" if cache.bundles else ""), markup=False)
    if cache.units and (cache.units.reused or cache.units.kept):
        out.print(f"exercise processes: {cache.units.reused} unit(s) restored instead of run, {cache.units.kept} "
                  "recorded for the next build", markup=False)
    for problem in cache.errors[:3]:
        err.print(f"warning: build cache {cache.location}: {problem}", markup=False)
    for bundle in target.bundles:
        out.print(f"wrote {bundle.path} ({human_size(bundle.path.stat().st_size)}) for {bundle.manifest.target.gpu}")
    for signed in target.signatures:
        out.print(f"signed {signed.bundle.name} with {signed.algorithm} key {signed.signer[:19]}… -> "
                  f"{signed.signature.name}", markup=False)


@main.command()
@click.option("--arch", "archs", multiple=True, help="Record ptxas for this arch only [default: every profile's].")
@click.option("--json", "as_json", is_flag=True, help="Print the fingerprint file `build --target-env` reads.")
def fingerprint(archs: tuple[str, ...], as_json: bool) -> None:
    """Print this environment's cache-key fingerprint: what a bundle must match to install here."""
    from rich.table import Table
    from rich.text import Text

    from .bundle.target_env import take
    from .format.manifest import capability_to_arch, flag_capability

    found = take([capability_to_arch(flag_capability(a)) for a in archs] or None)
    if as_json:
        _json(found.to_dict())
        return
    env = found.environment
    table = Table(title="cache-key fingerprint", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    rows = [("python", f"{env.python} ({env.platform})"), ("triton", str(env.triton)),
            ("triton_key sha256", str(env.triton_key_sha256))]
    rows += [(f"ptxas[{arch}]", _release_line(text)) for arch, text in env.ptxas.items()]
    rows += [("env vars", ", ".join(f"{k}={v}" for k, v in env.env_vars.items()) or "none set"),
             ("vllm", str(env.vllm)), ("flashinfer", str(env.flashinfer)), ("apache-tvm-ffi", str(found.tvm_ffi)),
             ("torch", f"{env.torch} (CUDA {found.torch_cuda})"), ("CUDA toolkit", str(found.cuda_toolkit)),
             ("GPUs", ", ".join(f"{g.name} ({g.arch}, {g.sm_count} SMs)" for g in found.gpus) or "none visible")]
    for name, value in rows:
        table.add_row(Text(name), Text(value))  # plain text: "ptxas[sm_90]" is not markup
    show(table)


def _release_line(ptxas: str) -> str:
    """``Cuda compilation tools, release 12.8, V12.8.93`` -> ``release 12.8, V12.8.93``."""
    lines = [line for line in ptxas.splitlines() if "release" in line] or ptxas.splitlines() or [""]
    return lines[0].rpartition("tools, ")[2]


@main.command()
def gpus() -> None:
    """List the GPU profiles (arch, SM count) builds can target."""
    from .plan.gpus import PROFILES

    table = _table()
    for column in ("profile", "arch", "SMs", "product"):
        table.add_column(column)
    for p in PROFILES.values():
        table.add_row(p.name, p.arch, str(p.sm_count), p.product)
    show(table)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def recipes(as_json: bool) -> None:
    """List the build recipes kernelcache ships (build --recipe NAME takes them)."""
    from .plan.catalog import recipes as shipped

    found = shipped()
    if as_json:
        _json(found.to_dict())
        return
    table = _table()
    table.add_column("recipe", no_wrap=True)  # what --recipe takes: whole, to copy
    for column in ("model", "vocab", "paths", "GPUs"):
        table.add_column(column, overflow="fold")
    for r in found.recipes:
        table.add_row(r.name, r.model or "-", " ".join(map(str, r.vocabs)), ", ".join(r.paths), ", ".join(r.gpus))
    show(table)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Bundle to write.")
@click.option("--keep-ir", is_flag=True, help="Also keep the IR files.")
@click.option("--arch", default=None, help="Pack only kernels for this arch.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def capture(output: str, keep_ir: bool, arch: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with a fresh Triton cache and pack what it compiled: kernelcache capture -o b.tar.zst -- CMD"""
    from .bundle.inspect import human_size
    from .capture import capture as do_capture

    _terminate_cleanly()
    result = do_capture(list(command), output, keep_ir=keep_ir, arch=arch)
    out.print(f"captured {len(result.manifest.kernels)} kernels, {len(result.manifest.modules)} modules into "
              f"{result.path} ({human_size(result.path.stat().st_size)})")


@main.command()
@click.argument("bundle", required=False, type=click.Path(exists=True, dir_okay=False))
@cache_dir_option
@plan_options("Exercise this build recipe (a shipped recipe's name or a TOML file) instead of the plan "
              "recorded in the bundle.")
@click.option("--json", "as_json", is_flag=True)
def verify(bundle, cache_dir, recipe, overrides, mode, jobs, as_json) -> None:
    """Run the bundle's vLLM paths against the installed cache; exit non-zero on any compile.

    Also exits non-zero when nothing was verified (the plan selects no task) and when a bundled FlashInfer
    module is not found and loaded by FlashInfer with JIT disabled."""
    from .verify import verify as do_verify

    _terminate_cleanly()  # verify installs only into its own scratch cache
    report = do_verify(bundle, cache_dir, recipe, overrides, mode=mode, jobs=jobs)
    if as_json:
        _json(report.to_dict())
    else:
        _verify_summary(report)
    failure = report.failure()
    if failure is not None:
        raise failure


def _verify_summary(report) -> None:
    if report.kernels:
        table = _table(title=f"verify {report.cache_dir} ({report.arch}, {report.mode})", title_justify="left")
        for column in ("kernel", "calls", "hits", "compiles"):
            table.add_column(column, justify="right" if column != "kernel" else "left")
        for k in report.kernels:
            table.add_row(k.name, str(k.calls), str(k.hits), f"[red]{k.compiles}[/red]" if k.compiles else "0")
        show(table)
    for check in report.flashinfer:
        state = "called" if check.called else "loaded" if check.loaded else "found" if check.found else "NOT FOUND"
        out.print(f"flashinfer {check.name} ({' '.join(check.archs)}): {state}"
                  + ("" if check.on_gpu else " (no GPU: not called)"), markup=False)
    if report.unexercised:
        names = sorted({k.name for k in report.unexercised})
        err.print(f"warning: {len(report.unexercised)} bundled kernel variant(s) no task asked for: "
                  f"{', '.join(names)}", markup=False)
    out.print(f"{report.tasks} tasks: {report.hits} hits, {report.compiles} compiles, {len(report.gcc_builds)} gcc "
              f"builds, {len(report.files_written)} files written in {report.seconds:.1f}s")


@main.command()
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Tuned bundle to write [default: <name>-tuned.tar.zst beside BUNDLE].")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Install and time in this dir, and keep it (absent or empty) [default: a temporary dir].")
@click.option("--json", "as_json", is_flag=True)
def tune(bundle: str, output: str | None, cache_dir: str | None, as_json: bool) -> None:
    """Time BUNDLE's autotuned kernels on a GPU of its profile and write a bundle that carries the choices.

    Served processes of a cache dir where such a bundle is installed take Triton's choices from it instead of
    timing every candidate config at first launch."""
    from .tune import tune as do_tune

    _terminate_cleanly()  # tune installs only into its own cache dir
    result = do_tune(bundle, output, cache_dir)
    if as_json:
        _json(result.to_dict())
        return
    names = sorted({c.kernel for c in result.choices})
    out.print(f"tuned {len(result.choices)} choice(s) for {len(names)} kernel(s) ({', '.join(names)}): "
              f"{result.benchmarks} candidate(s) timed, 0 compiles ({result.hits} hits) on "
              f"{result.tuning.where()} in {result.seconds:.1f}s", markup=False)
    out.print(f"wrote {result.path} (digest {result.digest[:16]})", markup=False)


# -- fleet distribution: registries, URLs, diff, merge ----------------------------------------------

arch_option = click.option("--arch", default=None, help="Pick the bundle for this arch (e.g. sm_90) from an index.")
gpu_option = click.option("--gpu", default=None, help="Pick the bundle for this GPU profile (e.g. h200) from an index.")


@main.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.argument("reference")
@click.option("--json", "as_json", is_flag=True)
@sign_option("each bundle and the index, as cosign signs images (at the sha256-DIGEST.sig tag)")
def push(bundles: tuple[str, ...], reference: str, as_json: bool, sign_key: str | None) -> None:
    """Push bundles to oci://HOST/REPO:TAG: one tag per arch (TAG-sm_90-h200), an index at TAG."""
    from .remote.oci import push as do_push

    result = do_push(list(bundles), reference, sign=sign_key)
    if as_json:
        _json(result.to_dict())
        return
    for item in result.pushed:
        signed = f", signed at {item.signature.rsplit(':', 1)[-1]}" if item.signature else ""
        out.print(f"pushed {item.bundle.name} -> {item.reference} ({item.digest[:19]}){signed}", markup=False)
    out.print(f"index {result.index} ({result.index_digest[:19]}) lists {len(result.variants)} bundle(s): "
              f"{', '.join(result.variants)}", markup=False)


@main.command()
@click.argument("reference")
@click.option("-o", "--output-dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Directory to write the bundle(s) into.")
@arch_option
@gpu_option
@click.option("--all", "every", is_flag=True, help="Pull every bundle an OCI index lists (mirroring).")
@click.option("--json", "as_json", is_flag=True)
def pull(reference: str, output_dir: str, arch: str | None, gpu: str | None, every: bool, as_json: bool) -> None:
    """Download and verify a bundle from oci://, http(s)://, file:// or an fsspec URL."""
    from .bundle.inspect import human_size
    from .bundle.signature import signature_info
    from .bundle.trust import signature_path
    from .remote import pull as do_pull

    landed = do_pull(reference, output_dir, arch=arch, gpu=gpu, every=every)
    if as_json:
        _json([x.to_dict() for x in landed])
        return
    for x in landed:
        target = x.manifest.target
        out.print(f"pulled {x.path} ({human_size(x.size)}): {len(x.manifest.kernels)} kernels for {target.arch}"
                  + (f" ({target.gpu})" if target.gpu else "") + f", digest {x.digest[:16]}", markup=False)
        if os.path.exists(signature_path(x.path)):
            out.print(f"  with its signature {x.path.name}.sig: {signature_info(x.path).describe()}", markup=False)


@main.command()
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True)
@click.option("--exit-code", is_flag=True, help="Exit with 1 when the bundles differ.")
def diff(a: str, b: str, as_json: bool, exit_code: bool) -> None:
    """What B changes relative to A: target, fingerprint fields, kernels and variants, modules."""
    from .bundle.compare import diff as do_diff
    from .remote import local_bundle

    with local_bundle(a) as path_a, local_bundle(b) as path_b:
        result = do_diff(path_a, path_b)
    if as_json:
        _json(result.to_dict())
    else:
        _render_diff(result)
    if exit_code and not result.identical:
        sys.exit(1)


def _render_diff(result) -> None:
    a, b = result.digests
    if result.identical:
        out.print(f"identical: both bundles are {a[:16]}")
        return
    out.print(f"A {a[:16]} ({result.a.target.arch}, {len(result.a.kernels)} kernel variants)  "
              f"B {b[:16]} ({result.b.target.arch}, {len(result.b.kernels)} kernel variants)")
    out.print("fingerprint: " + ("same" if result.same_fingerprint else "[bold red]DIFFERENT[/bold red] "
                                 "(the bundles' kernels cannot hit in one environment)"))
    if result.target or result.environment:
        table = _table(title="fields", title_justify="left")
        for column in ("field", "A", "B"):
            table.add_column(column, overflow="fold")
        for change in (*result.target, *result.environment):
            table.add_row(change.field + ("" if change.blocking else " (not in any key)"),
                          change.a or "(none)", change.b or "(none)")
        show(table)
    counts = ", ".join(f"{result.count(c)} {c}" for c in ("added", "removed", "changed"))
    out.print(f"kernel variants: {counts}; kernels only in B: {', '.join(result.kernels_added) or 'none'}; "
              f"only in A: {', '.join(result.kernels_removed) or 'none'}", markup=False)
    if result.entries:
        table = _table(title="entries", title_justify="left")
        for column in ("", "kind", "name", "key", "variant"):
            table.add_column(column, overflow="fold")
        marks = {"added": "+", "removed": "-", "changed": "~"}
        for entry in result.entries:
            table.add_row(marks[entry.change], entry.kind, entry.name, entry.key[:12], entry.detail)
        show(table)


@main.command()
@click.argument("a")
@click.argument("b")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Bundle to write (.tar.zst).")
def merge(a: str, b: str, output: str) -> None:
    """Combine two bundles of one target and fingerprint; refuses anything else."""
    from .bundle.compare import merge as do_merge
    from .remote import local_bundle

    with local_bundle(a) as path_a, local_bundle(b) as path_b:
        result = do_merge(path_a, path_b, output)
    for warning in result.warnings:
        err.print(f"warning: {warning}", markup=False)
    out.print(f"wrote {result.path}: {len(result.manifest.kernels)} kernel variants ({result.added} from B), "
              f"{len(result.manifest.modules)} modules, digest {result.digest[:16]}", markup=False)
