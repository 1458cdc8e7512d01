"""The vLLM releases kernelcache builds for, and each family's contact points with vLLM's internals.

A family's exercise runs vLLM's own code, so it touches vLLM's internals: modules, classes, functions, call
signatures that vLLM may move or change in any release. Each family names those contact points once, in its
declaration (plan/families/): a ``Contact`` is one ``module:symbol`` (``module:Class.method`` for a method) and
the releases it holds for; a symbol that moved is two contacts of one ``name``. The exercise asks ``resolve``
for the installed release's object, and tests/test_serving_releases.py imports every contact of the installed
release, so a new vLLM fails there with the moved symbol named, not deep inside a build.

``SUPPORTED`` lists the minor releases (``0.34`` stands for ``0.34.*``); a family that a release lacks says so in
its ``releases``. ``kernelcache build`` checks the installed vLLM against both before any compile
(plan/targets.py ``check_release``).
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

SUPPORTED = ("0.33", "0.34")  # vLLM minor releases, oldest first


@dataclass(frozen=True)
class Contact:
    """One vLLM internal a family's exercise imports or calls: ``symbol`` is ``module:attr`` (or
    ``module:Class.attr``), found in the ``releases`` listed; ``params``, when given, is the callable's parameter
    names there (a signature that changed is a contact per release)."""

    name: str  # what the exercise asks ``resolve`` for
    symbol: str
    releases: tuple[str, ...] = SUPPORTED
    params: tuple[str, ...] | None = None

    @property
    def module(self) -> str:
        return self.symbol.partition(":")[0]

    @property
    def attrs(self) -> tuple[str, ...]:
        attr = self.symbol.partition(":")[2]
        return tuple(attr.split(".")) if attr else ()

    def load(self) -> Any:
        """The object this contact names in the installed vLLM (ImportError or AttributeError if it is not there)."""
        found = importlib.import_module(self.module)
        for attr in self.attrs:
            found = _attribute(found, attr)
        return found

    def problem(self) -> str | None:
        """Why this contact does not hold on the installed vLLM (None when it does)."""
        try:
            found = self.load()
        except (ImportError, AttributeError) as exc:
            return f"{self.symbol} is not in the installed vllm {installed()} ({type(exc).__name__}: {exc})"
        if self.params is not None:
            have = tuple(inspect.signature(found).parameters)
            if have[:len(self.params)] != self.params:
                return (f"{self.symbol} takes ({', '.join(have)}) in the installed vllm {installed()}, "
                        f"not ({', '.join(self.params)})")
        return None


def _attribute(owner: Any, attr: str) -> Any:
    """``owner.attr``, or the submodule ``owner.attr`` when ``owner`` is a package that has not imported it."""
    if hasattr(owner, attr):
        return getattr(owner, attr)
    if inspect.ismodule(owner):
        return importlib.import_module(f"{owner.__name__}.{attr}")
    raise AttributeError(f"{owner.__name__ if hasattr(owner, '__name__') else owner!r} has no attribute {attr!r}")


def minor(version: str) -> str:
    """``0.34.0``, ``0.34.1rc1`` or ``0.34.1.dev3+gabc`` -> ``0.34``; a version without two numbers stays whole."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return f"{found.group(1)}.{found.group(2)}" if found else version


@cache
def installed() -> str:
    """The installed vLLM's version (its distribution's metadata), ``""`` when none is installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm")
    except PackageNotFoundError:
        return ""


def release() -> str:
    """The installed vLLM's minor release (``0.34``)."""
    return minor(installed())


def since(first: str) -> bool:
    """Whether the installed vLLM is ``first`` (a minor release) or newer."""
    return _key(release()) >= _key(first)


def _key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name)[:2])


def contacts_for(contacts: tuple[Contact, ...], name: str) -> tuple[Contact, ...]:
    return tuple(c for c in contacts if c.name == name)


def current(contacts: tuple[Contact, ...], version: str | None = None) -> tuple[Contact, ...]:
    """The contacts that hold on ``version``'s release (the installed one by default)."""
    wanted = minor(version) if version is not None else release()
    return tuple(c for c in contacts if wanted in c.releases)


def resolve(contacts: tuple[Contact, ...], name: str) -> Any:
    """The installed release's object for the contact ``name`` (the newest release's when the installed one is
    not listed: a build past the supported releases was refused already unless a test asked for it)."""
    named = contacts_for(contacts, name)
    if not named:
        raise KeyError(f"no contact named {name!r}")
    mine = current(named) or named[-1:]
    return mine[0].load()


def stable(*symbols: str) -> tuple[Contact, ...]:
    """Contacts that hold on every supported release, each named after its last part (``module:Class.attr`` ->
    ``attr``; a bare module by its whole name)."""
    return tuple(Contact(_last(s), s) for s in symbols)


def _last(symbol: str) -> str:
    module, _, attr = symbol.partition(":")
    return attr.rsplit(".", 1)[-1] if attr else module
