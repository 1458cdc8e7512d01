"""The options several commands share: the cache dir, the signature policy, a bundle's size limits, the read-only
overlay, a build's plan and exercise processes, the build cache, a pick from an OCI index."""

from __future__ import annotations

import dataclasses
import functools

import click

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
    from ..format.archive import Limits, parse_size

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
        from ..plan.families import path_help

        self.help = path_help()
        return super().get_help_record(ctx)


# The flags that override a recipe's plan: each one's parameter is the PlanOverrides field (plan/recipe.py) it sets.
PLAN_OVERRIDES = (
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
)  # then each family's own vLLM flags (plan_options: ``Family.flags``, from the registry)
# How the exercise processes run.
EXERCISE_OPTIONS = (
    click.option("--mode", type=click.Choice(["auto", "cross", "native"]), default="auto", show_default=True,
                 help="native: run on a visible GPU of the arch; cross: a faithful fake target; "
                      "auto: native if possible."),
    click.option("--jobs", type=click.IntRange(min=1), default=None,
                 help="Exercise processes at once [default: all cores]."),
)


def plan_options(recipe_help: str):
    """The options ``build`` and ``verify`` share: a recipe, the flags that override its plan (handed on as
    one ``PlanOverrides``, the ``overrides`` argument), and how the exercise processes run. The families' own
    vLLM flags (``Family.flags``, from the registry plan/families/) follow the engine's."""
    from ..plan import families

    flags = tuple(click.option(flag.vllm, flag.name, default=None, help=flag.help) for flag in families.flags())
    recipe = click.option("--recipe", "--manifest", "recipe", type=click.Path(dir_okay=False), default=None,
                          metavar="NAME|FILE", help=recipe_help + " (--manifest: its old name)")

    def decorate(func):
        @functools.wraps(func)
        def command(*args, **kwargs):
            from ..plan.recipe import PlanOverrides

            names = [field.name for field in dataclasses.fields(PlanOverrides)
                     if field.name in kwargs and field.name != "serve"]  # serve: build's argument, after --
            names += [flag.name for flag in families.flags() if flag.name not in names]
            overrides = PlanOverrides.of(**{name: kwargs.pop(name) for name in names})
            return func(*args, overrides=overrides, **kwargs)

        for option in reversed((recipe, *PLAN_OVERRIDES, *flags, *EXERCISE_OPTIONS)):
            command = option(command)
        return command

    return decorate


def build_cache_option(what: str):
    """``--build-cache [DIR]``: act on the build cache (the default one without DIR) instead of a cache dir."""
    return click.option("--build-cache", "build_cache", is_flag=False, flag_value="", default=None, metavar="[DIR]",
                        help=f"{what} the build cache (DIR, else the one `build` uses) instead of a cache dir.")


def only_one(cache_dir: str | None, build_cache: str | None) -> str | None:
    """The build cache asked for (None: the default one), after refusing it together with --cache-dir."""
    from ..errors import UsageError

    if cache_dir is not None:
        raise UsageError("--cache-dir and --build-cache exclude each other")
    return build_cache or None


arch_option = click.option("--arch", default=None, help="Pick the bundle for this arch (e.g. sm_90) from an index.")
gpu_option = click.option("--gpu", default=None, help="Pick the bundle for this GPU profile (e.g. h200) from an index.")
