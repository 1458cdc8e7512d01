"""The ``kernelcache`` command's entry point: the pod-start verbs in their plain forms, before click loads.

``install`` / ``env`` / ``run`` sit on every pod start; importing click alone takes about as long as the
work of a no-op install (~30 ms on 2 cores). This module recognises, with the standard library, exactly
these forms and calls the same Python API the click commands call:

* ``install BUNDLE [--cache-dir D] [--no-gpu-check] [--json] [--gpu G] [--arch A] [--require-signature]
  [--trusted-key K]...``: of a
  bundle file this cache dir accepted before under what holds now, its signature policy included
  (cachedir/checked.py), the no-op answer, without the installer; else the
  install itself, as the click command (cli/serving.py) makes it (the same API call, and one renderer of the
  output, render.py); its errors are said by ``cli.fail``, exactly as the click command says them, and never run
  again through click;
* ``env [--cache-dir D] [--json]``: the variables kept by the last computation when everything they rested on
  holds (runtime/served.py), else ``runtime.env.env``;
* ``run [--bundle B] [--cache-dir D] [--strict] [--require-signature] [--trusted-key K]... [--] COMMAND...``:
  compare a ``vllm serve`` COMMAND with the installed bundles' (runtime/match.py), then exec COMMAND with those kept
  variables (with ``--bundle``, only when that bundle's no-op is answered from its record too, under
  the same signature policy: asked once, before the installer is loaded), else ``runtime.env.run``'s work
  (``prepare``, with the bundle installed first where the answer was no).
* ``--version``: what click's ``version_option`` prints (``kernelcache, version 0.1.0``), from the package alone.

Anything else (another verb or option, ``--help``, a ``--cache-dir`` click's parser refuses) and any error
before an install starts goes to the click CLI (cli/), which parses the arguments itself and renders errors
and tables as always; a failed call there repeats nothing that was not idempotent (``env`` and ``run`` only
read, or finish an interrupted install, before they print or exec).
"""

from __future__ import annotations

import sys

# flag -> takes a value; the options each plain form accepts (all else goes to click).
_SIGNATURE = {"--require-signature": False, "--trusted-key": True}
_FORMS = {
    "install": {"--cache-dir": True, "--no-gpu-check": False, "--json": False, "--gpu": True, "--arch": True,
                **_SIGNATURE},
    "env": {"--cache-dir": True, "--json": False},
    "run": {"--cache-dir": True, "--bundle": True, "--strict": False, **_SIGNATURE},
}
_REPEATED = ("--trusted-key",)  # given more than once: each value counts (click's multiple=True)


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from .version import __version__

        print(f"kernelcache, version {__version__}")
        return
    try:
        plain = _plain(sys.argv[1:])
    except KeyboardInterrupt:  # as the click CLI says it
        print("kernelcache: interrupted", file=sys.stderr)
        sys.exit(130)
    if not plain:
        from .cli import main as cli

        cli(prog_name="kernelcache")


def parse(args: list[str]) -> tuple[str, dict[str, str | bool], list[str]] | None:
    """(verb, options, positionals) of a plain form, or None. As click parses them: ``--name value`` or
    ``--name=value``, the last one wins (a repeated option's values make a list); ``install`` and ``env`` take
    options anywhere, ``run`` only before its command (which starts at the first positional or after ``--``)."""
    if not args or args[0] not in _FORMS:
        return None
    verb, accepted = args[0], _FORMS[args[0]]
    options: dict[str, str | bool] = {}
    rest = args[1:]
    positionals: list[str] = []
    while rest:
        arg, rest = rest[0], rest[1:]
        if verb == "run" and arg == "--":
            return verb, options, rest
        if arg == "--" or not arg.startswith("-") or arg == "-":
            if verb == "run":
                return verb, options, [arg, *rest]
            positionals.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if name not in accepted or (eq and not accepted[name]):
            return None
        if accepted[name] and not eq:
            if not rest:
                return None
            value, rest = rest[0], rest[1:]
        if name in _REPEATED:
            options[name] = [*options.get(name, []), value]  # type: ignore[list-item]
        else:
            options[name] = value if accepted[name] else True
    return verb, options, positionals


def _policy(options: dict):
    """The signature policy of a plain form's options (bundle/trust.py; the environment where none are given)."""
    from .bundle.trust import policy

    return policy(True if options.get("--require-signature") else None, options.get("--trusted-key"))


def _plain(args: list[str]) -> bool:
    """Run a plain form; False when it is not one, or when the API raised (click runs it then)."""
    parsed = parse(args)
    if parsed is None:
        return False
    verb, options, positionals = parsed
    try:
        return {"install": _install, "env": _env, "run": _run}[verb](options, positionals)
    except OSError:
        return False
    except Exception as exc:
        from .errors import KernelcacheError  # here: a no-op install raises nothing, and errors.py costs it 1-3 ms

        if isinstance(exc, KernelcacheError):
            return False
        raise


def _root(options: dict) -> str:
    """The cache dir of ``--cache-dir`` (its default when not given), resolved once for the plain form's work."""
    from .cachedir.layout import cache_root

    return cache_root(options.get("--cache-dir"))


def _install(options: dict, positionals: list[str]) -> bool:
    if len(positionals) != 1:
        return False
    from .cachedir.checked import find_checked

    check_gpu = not options.get("--no-gpu-check")
    signature_policy = _policy(options)
    wanted = {"arch": options.get("--arch"), "gpu": options.get("--gpu")}  # what the bundle must be built for
    root = _root(options)
    found = find_checked(positionals[0], root, check_gpu, signature_policy, **wanted)
    if found is None:
        return _install_now(positionals[0], root, check_gpu, bool(options.get("--json")), signature_policy,
                            **wanted)
    _render_install({"cache_dir": str(found.cache_dir), "digest": found.digest, "action": "already-installed",
                     "written": 0, "present": 0, "seconds": 0.0, "warnings": list(found.warnings),
                     "signature": found.signature, "choices": found.choices},
                    bool(options.get("--json")))
    return True


def _prepare(root: str) -> dict[str, str]:
    """``runtime.env.prepare`` of the cache dir ``root`` (no bundle): interrupted installs finished, its variables
    computed and kept for the next start."""
    from pathlib import Path

    from .cachedir import CacheDir
    from .runtime.env import prepare

    return prepare(None, CacheDir(Path(root)))


def _install_for_run(bundle: str, root: str, signature_policy) -> None:
    """``run --bundle``'s install, as ``runtime.env.install_checked`` makes it once its question was answered no."""
    from pathlib import Path

    from .cachedir import CacheDir
    from .install import install_into

    install_into(bundle, CacheDir(Path(root)), signature_policy=signature_policy)


def _not_a_dir(root: str) -> bool:
    """Whether the cache dir exists and is not a directory: click's parser refuses such a ``--cache-dir``
    (``click.Path(file_okay=False)``), and the API a default one (``UsageError``); either way click says it."""
    import os

    return os.path.exists(root) and not os.path.isdir(root)


def _install_now(bundle: str, root: str, check_gpu: bool, as_json: bool, signature_policy, arch: str | None = None,
                 gpu: str | None = None) -> bool:
    """What the click ``install`` does with these options, without click: the same API call, output and errors (an
    error is said by ``cli.fail``, which loads click then). False, for click, where the cache dir ``root`` is not a
    directory (``_not_a_dir``)."""
    if _not_a_dir(root):
        return False
    from .errors import KernelcacheError

    try:
        from pathlib import Path

        from .cachedir import CacheDir
        from .format.archive import Limits
        from .install import install_into

        limits = Limits.from_env()  # as cli.options.make_limits, with no --max-* flags
        result = install_into(bundle, CacheDir(Path(root)), check_gpu=check_gpu, limits=limits, arch=arch, gpu=gpu,
                              signature_policy=signature_policy).to_dict()
    except (KernelcacheError, OSError) as exc:
        from .cli import fail

        fail(exc)  # exits
    _render_install(result, as_json)
    return True


def _render_install(result: dict, as_json: bool) -> None:
    """As ``cli.serving`` renders an install without ``--force`` (so no FORCED warning, the one click styles)."""
    from .render import install_summary

    for warning in result["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(install_summary(result, as_json))


def _env(options: dict, positionals: list[str]) -> bool:
    if positionals:
        return False
    from .runtime.served import find_served

    root = _root(options)
    variables = find_served(root)
    if variables is None:  # runtime.env.env's work, on the cache dir resolved once
        if _not_a_dir(root):
            return False
        variables = _prepare(root)
    if options.get("--json"):
        import json

        print(json.dumps(variables, indent=1))
    else:
        from .runtime.shell import shell_exports

        print(shell_exports(variables), end="")
    return True


def _run(options: dict, command: list[str]) -> bool:
    if not command:
        return False
    bundle, root = options.get("--bundle"), _root(options)
    from .runtime.served import find_served

    variables = find_served(root)
    if bundle is not None:  # asked once: was it accepted here before under what holds now?
        from .cachedir.checked import find_checked

        signature_policy = _policy(options)
        if find_checked(bundle, root, policy=signature_policy) is None:
            if _not_a_dir(root):
                return False
            _install_for_run(bundle, root, signature_policy)
            variables = None
    if variables is None:  # runtime.env.run's work, after the install
        if _not_a_dir(root):
            return False
        variables = _prepare(root)
    from .runtime.match import check
    from .runtime.shell import exec_command

    check(command, root, bool(options.get("--strict")))  # a ServeMismatch: cli.fail says it, exit 22
    exec_command(command, variables)  # a UsageError (not found, not executable): click runs it and says why
    return True  # not reached
