"""The build side's verbs: build, verify, capture, pack, tune, and what a build can target (fingerprint, gpus,
recipes)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import click

from .app import main, terminate_cleanly
from .options import cache_dir_option, plan_options, sign_option
from .output import err, new_table, out, print_json, show


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
@click.option("--serve-env", "serve_env", multiple=True, metavar="NAME=VALUE",
              help="A variable vLLM hashes into its compile cache's key (CUDA_HOME or a VLLM_* one), as the serving "
                   "environment sets it: the compile path's vLLM computes its key with it (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@sign_option("each bundle (B.tar.zst.sig beside it)")
@click.argument("serve", nargs=-1, type=click.UNPROCESSED, metavar="[-- vllm serve MODEL [FLAGS]]")
def build(arch, recipe, overrides, mode, jobs, output_dir, keep_ir, workdir, miss_logs, target_env, build_cache,
          no_build_cache, serve_env, as_json, sign_key, serve) -> None:
    """Build the kernels a vLLM server runs on ARCH into one bundle per GPU profile.

    \b
    For a model, give the command the server runs, after --:
      kernelcache build --arch sm_90 --gpu h100-sxm -- vllm serve Qwen/Qwen3-8B --max-model-len 32768
    The installed vLLM parses it with its own parser and configures it as a server on each GPU profile would
    (limits, block size, KV-cache dtype, drafts, attention backend); the bundle records the command and vLLM's
    config hash. MODEL is a local directory holding config.json, or a hub id with --model-config CONFIG.json (or
    one kernelcache ships a config for); nothing is fetched. Without a serve command: a recipe's plan (the sampler
    paths for its vocab sizes by default). With --path compile, give each variable vLLM hashes that the serving
    environment sets with --serve-env (vLLM's images set CUDA_HOME=/usr/local/cuda)."""
    import os
    from dataclasses import replace

    from ..build import build as do_build
    from ..enginecompile import SERVE_ENV, serve_env_of
    from ..errors import UsageError

    if serve_env:
        os.environ[SERVE_ENV] = serve_env_of(serve_env)

    if serve:
        overrides = replace(overrides, serve=serve)
    if build_cache is not None and no_build_cache:
        raise UsageError("--build-cache and --no-build-cache exclude each other")
    terminate_cleanly()
    with progress_bar(as_json) as progress:
        result = do_build(arch, recipe, overrides, mode=mode, jobs=jobs, output_dir=output_dir, keep_ir=keep_ir,
                          workdir=workdir, progress=progress, from_misses=list(miss_logs), target_env=target_env,
                          sign=sign_key, build_cache=False if no_build_cache else build_cache)
    if as_json:
        print_json([t.to_dict() for t in result.targets])
        return
    for target in result.targets:
        _build_summary(target)



@contextlib.contextmanager
def progress_bar(as_json: bool) -> Iterator[Callable[[str, int, int], None]]:
    """A build's ``progress(label, done, total)``: a bar per family on a terminal; piped stderr (CI logs) keeps its
    one-line errors and gets a line per finished exercise process instead."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err.console(), transient=True, disable=as_json or not err.is_terminal) as bar:
        tasks: dict[str, int] = {}

        def progress(label: str, done: int, total: int) -> None:
            if not err.is_terminal and not as_json and done:  # a log gets a line per finished process
                err.print(f"{label}: {done}/{total} exercise processes done", markup=False)
            if label not in tasks:
                tasks[label] = bar.add_task(f"exercising {label}", total=total)
            bar.update(tasks[label], completed=done)

        yield progress


def _build_summary(target) -> None:
    from ..bundle.inspect import human_size

    t = target.target
    table = new_table(title=f"{t.arch}, {t.sm_count} SMs ({t.mode})", title_justify="left")
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
@click.argument("bundle", required=False, type=click.Path(exists=True, dir_okay=False))
@cache_dir_option
@plan_options("Exercise this build recipe (a shipped recipe's name or a TOML file) instead of the plan "
              "recorded in the bundle.")
@click.option("--json", "as_json", is_flag=True)
def verify(bundle, cache_dir, recipe, overrides, mode, jobs, as_json) -> None:
    """Run the bundle's vLLM paths against the installed cache; exit non-zero on any compile.

    Also exits non-zero when nothing was verified (the plan selects no task) and when a bundled FlashInfer
    module is not found and loaded by FlashInfer with JIT disabled."""
    from ..verify import verify as do_verify

    terminate_cleanly()  # verify installs only into its own scratch cache
    report = do_verify(bundle, cache_dir, recipe, overrides, mode=mode, jobs=jobs)
    if as_json:
        print_json(report.to_dict())
    else:
        _verify_summary(report)
    failure = report.failure()
    if failure is not None:
        raise failure


def _verify_summary(report) -> None:
    if report.kernels:
        table = new_table(title=f"verify {report.cache_dir} ({report.arch}, {report.mode})", title_justify="left")
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


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Bundle to write.")
@click.option("--keep-ir", is_flag=True, help="Also keep the IR files.")
@click.option("--arch", default=None, help="Pack only kernels for this arch.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def capture(output: str, keep_ir: bool, arch: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND with a fresh Triton cache and pack what it compiled: kernelcache capture -o b.tar.zst -- CMD"""
    from ..bundle.inspect import human_size
    from ..capture import capture as do_capture

    terminate_cleanly()
    result = do_capture(list(command), output, keep_ir=keep_ir, arch=arch)
    out.print(f"captured {len(result.manifest.kernels)} kernels, {len(result.manifest.modules)} modules into "
              f"{result.path} ({human_size(result.path.stat().st_size)})")


@main.command()
@click.argument("cache_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Bundle to write (.tar.zst).")
@click.option("--keep-ir", is_flag=True, help="Also keep the IR files (ttir, ttgir, llir, ptx, source).")
@click.option("--arch", default=None, help="Pack only kernels for this arch (e.g. sm_90).")
@click.option("--compile-log", type=click.Path(exists=True, dir_okay=False), default=None,
              help="kernelcache compile log with signatures and constexprs.")
def pack(cache_dir: str, output: str, keep_ir: bool, arch: str | None, compile_log: str | None) -> None:
    """Bundle an existing Triton cache directory."""
    from ..bundle.inspect import human_size
    from ..bundle.make import pack as do_pack

    result = do_pack(cache_dir, output, keep_ir=keep_ir, compile_log=compile_log, arch=arch)
    manifest = result.manifest
    out.print(f"wrote {result.path} ({human_size(result.path.stat().st_size)}): {len(manifest.kernels)} kernels, "
              f"{len(manifest.modules)} modules, target {manifest.target.arch}, digest {result.digest[:16]}")
    for skip in result.skipped:
        err.print(f"skipped {skip['path']}: {skip['reason']}", markup=False)


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
    from ..tune import tune as do_tune

    terminate_cleanly()  # tune installs only into its own cache dir
    result = do_tune(bundle, output, cache_dir)
    if as_json:
        print_json(result.to_dict())
        return
    names = sorted({c.kernel for c in result.choices})
    out.print(f"tuned {len(result.choices)} choice(s) for {len(names)} kernel(s) ({', '.join(names)}): "
              f"{result.benchmarks} candidate(s) timed, 0 compiles ({result.hits} hits) on "
              f"{result.tuning.where()} in {result.seconds:.1f}s", markup=False)
    out.print(f"wrote {result.path} (digest {result.digest[:16]})", markup=False)


@main.command()
@click.option("--arch", "archs", multiple=True, help="Record ptxas for this arch only [default: every profile's].")
@click.option("--json", "as_json", is_flag=True, help="Print the fingerprint file `build --target-env` reads.")
def fingerprint(archs: tuple[str, ...], as_json: bool) -> None:
    """Print this environment's cache-key fingerprint: what a bundle must match to install here."""
    from rich.table import Table
    from rich.text import Text

    from ..bundle.target_env import take
    from ..format.manifest import capability_to_arch, flag_capability

    found = take([capability_to_arch(flag_capability(a)) for a in archs] or None)
    if as_json:
        print_json(found.to_dict())
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
    from ..plan.gpus import PROFILES

    table = new_table()
    for column in ("profile", "arch", "SMs", "product"):
        table.add_column(column)
    for p in PROFILES.values():
        table.add_row(p.name, p.arch, str(p.sm_count), p.product)
    show(table)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def recipes(as_json: bool) -> None:
    """List the build recipes kernelcache ships (build --recipe NAME takes them)."""
    from ..plan.catalog import recipes as shipped

    found = shipped()
    if as_json:
        print_json(found.to_dict())
        return
    table = new_table()
    table.add_column("recipe", no_wrap=True)  # what --recipe takes: whole, to copy
    for column in ("model", "vocab", "paths", "GPUs"):
        table.add_column(column, overflow="fold")
    for r in found.recipes:
        table.add_row(r.name, r.model or "-", " ".join(map(str, r.vocabs)), ", ".join(r.paths), ", ".join(r.gpus))
    show(table)
