"""The verbs on bundle files: inspect, sign, and the fleet's push, pull, diff and merge."""

from __future__ import annotations

import os
import sys

import click

from .app import main
from .options import arch_option, gpu_option, sign_option
from .output import err, new_table, out, print_json, show


@main.command()
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(bundle: str, as_json: bool) -> None:
    """Show what a bundle holds: kernels, variants, sizes, target, versions."""
    from ..bundle.inspect import human_size
    from ..bundle.inspect import inspect as do_inspect
    from ..manage import built_for

    info = do_inspect(bundle)
    if as_json:
        print_json(info.to_dict())
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
    table = new_table(title_justify="left")
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
    from ..bundle.signature import load_signing_key
    from ..bundle.signature import sign as do_sign

    signer = load_signing_key(key)  # a bad key fails before any bundle is read
    results = [do_sign(bundle, signer) for bundle in bundles]
    if as_json:
        print_json([r.to_dict() for r in results])
        return
    for r in results:
        out.print(f"signed {r.bundle.name} (sha256 {r.sha256[:16]}…, digest {r.digest[:16]}) with {r.algorithm} key "
                  f"{r.signer[:19]}… -> {r.signature}", markup=False)


@main.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.argument("reference")
@click.option("--json", "as_json", is_flag=True)
@sign_option("each bundle and the index, as cosign signs images (at the sha256-DIGEST.sig tag)")
def push(bundles: tuple[str, ...], reference: str, as_json: bool, sign_key: str | None) -> None:
    """Push bundles to oci://HOST/REPO:TAG: one tag per arch (TAG-sm_90-h200), an index at TAG."""
    from ..remote.oci import push as do_push

    result = do_push(list(bundles), reference, sign=sign_key)
    if as_json:
        print_json(result.to_dict())
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
    from ..bundle.inspect import human_size
    from ..bundle.signature import signature_info
    from ..bundle.trust import signature_path
    from ..remote import pull as do_pull

    landed = do_pull(reference, output_dir, arch=arch, gpu=gpu, every=every)
    if as_json:
        print_json([x.to_dict() for x in landed])
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
    from ..bundle.compare import diff as do_diff
    from ..remote import local_bundle

    with local_bundle(a) as path_a, local_bundle(b) as path_b:
        result = do_diff(path_a, path_b)
    if as_json:
        print_json(result.to_dict())
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
        table = new_table(title="fields", title_justify="left")
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
        table = new_table(title="entries", title_justify="left")
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
    from ..bundle.compare import merge as do_merge
    from ..remote import local_bundle

    with local_bundle(a) as path_a, local_bundle(b) as path_b:
        result = do_merge(path_a, path_b, output)
    for warning in result.warnings:
        err.print(f"warning: {warning}", markup=False)
    out.print(f"wrote {result.path}: {len(result.manifest.kernels)} kernel variants ({result.added} from B), "
              f"{len(result.manifest.modules)} modules, digest {result.digest[:16]}", markup=False)
