"""The manifest's canonical JSON form, made without ``dataclasses.asdict`` and json's pure-Python encoder.

A bundle's digest is the sha256 of its manifest's canonical form, ``json.dumps(data, indent=1)`` of
``data = _plain(asdict(manifest))`` (format/manifest.py). For a 400-kernel sampler manifest that costs a cold
install ~40 ms: ~20 ms in ``asdict`` (it deep-copies every leaf) and ~20 ms in json's encoder, which runs
in pure Python whenever ``indent`` is given. The two functions here give exactly the same values and bytes
(tests/test_canonical.py compares them with the standard library's on real manifests and edge cases):

* ``plain(value)``: ``_plain(asdict(value))`` for dataclasses, lists, tuples, dicts with ``str`` keys and
  leaves of exactly ``str``, ``int``, ``bool``, ``float`` or ``None``;
* ``dumps(data)``: ``json.dumps(data, indent=1, allow_nan=False)`` for such plain data. Containers whose items
  are all scalars (a file record, a kernel's signature) are written by json's C encoder, whose item separator
  carries the indentation of their depth; a dict of lists (a kernel's ``attrs``) is written once per distinct
  compact form at a given depth, since the indented text is a function of the compact one and the depth.

Anything else (a subclass, another leaf type, a non-finite float) raises ``Unusual``, and the caller takes
the standard library's path, which defines the canonical form.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring_ascii

__all__ = ["Unusual", "dumps", "plain"]


class Unusual(Exception):  # noqa: N818 -- a signal to take the standard library's path, not an error
    """A value outside what the fast paths handle exactly."""


def _unusual(value: object) -> None:
    raise Unusual(type(value).__name__)


if c_make_encoder is None:  # an interpreter without json's C accelerator: the standard library's path always
    def _encoder(key_separator: str, item_separator: str, allow_nan: bool) -> Callable:
        return _unusual
else:
    def _encoder(key_separator: str, item_separator: str, allow_nan: bool) -> Callable:
        # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan)
        return c_make_encoder(None, _unusual, encode_basestring_ascii, None, key_separator, item_separator,
                              False, False, allow_nan)

_str = encode_basestring_ascii
_INDENT: list[str] = []
_SCALARS = frozenset((str, int, bool, type(None)))
_KEYS = frozenset((str,))
_COMPACT = _encoder(":", ",", True)  # a memo key only: the token sequence of a container
_ITEMS: dict[int, Callable] = {}
_FIELDS: dict[type, tuple[str, ...]] = {}


def _indent(depth: int) -> str:
    while len(_INDENT) <= depth:
        _INDENT.append("\n" + " " * len(_INDENT))
    return _INDENT[depth]


def _items(depth: int) -> Callable:
    """The C encoder of a flat container at ``depth``: its items separated as ``indent=1`` separates them."""
    found = _ITEMS.get(depth)
    if found is None:
        found = _ITEMS[depth] = _encoder(": ", "," + _indent(depth + 1), False)
    return found


def dumps(data: object) -> str:
    """``json.dumps(data, indent=1, allow_nan=False)`` of plain data (``Unusual`` for anything else)."""
    out: list[str] = []
    _value(data, 0, out.append, {})
    return "".join(out)


def _value(v: object, d: int, out: Callable[[str], None], memo: dict) -> None:
    t = type(v)
    if t is dict:
        if not v:
            out("{}")
        elif not _KEYS.issuperset(map(type, v)):
            raise Unusual("a key that is not a str")
        elif _SCALARS.issuperset(types := set(map(type, v.values()))):
            out("{" + _indent(d + 1) + "".join(_items(d)(v, 0))[1:-1] + _indent(d) + "}")
        elif dict in types:
            _dict(v, d, out, memo)
        else:  # lists and scalars below: written once per distinct content at this depth
            key = (d, "".join(_COMPACT(v, 0)))
            found = memo.get(key)
            if found is None:
                parts: list[str] = []
                _dict(v, d, parts.append, memo)
                found = memo[key] = "".join(parts)
            out(found)
    elif t is list:
        if not v:
            out("[]")
        elif _SCALARS.issuperset(map(type, v)):
            out("[" + _indent(d + 1) + "".join(_items(d)(v, 0))[1:-1] + _indent(d) + "]")
        else:
            between, sep = "," + _indent(d + 1), "[" + _indent(d + 1)
            for x in v:
                out(sep)
                sep = between
                _value(x, d + 1, out, memo)
            out(_indent(d) + "]")
    elif t is str:
        out(_str(v))
    elif t is int:
        out(int.__repr__(v))
    elif t is float and math.isfinite(v):
        out(float.__repr__(v))
    elif v is None:
        out("null")
    elif v is True:
        out("true")
    elif v is False:
        out("false")
    else:
        raise Unusual(t.__name__)


def _dict(v: dict, d: int, out: Callable[[str], None], memo: dict) -> None:
    between, sep = "," + _indent(d + 1), "{" + _indent(d + 1)
    for k, x in v.items():
        out(sep + _str(k) + ": ")
        sep = between
        _value(x, d + 1, out, memo)
    out(_indent(d) + "}")


def plain(value: object) -> object:
    """``_plain(asdict(value))`` (format/manifest.py) without the deep copy (``Unusual`` outside the fast path)."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is float:
        return value if math.isfinite(value) else str(value)
    if t is list or t is tuple:
        return [plain(x) for x in value]
    if t is dict:
        if not _KEYS.issuperset(map(type, value)):
            raise Unusual("a key that is not a str")
        return {k: plain(x) for k, x in value.items()}
    names = _FIELDS.get(t)
    if names is None:
        if not dataclasses.is_dataclass(t):
            raise Unusual(t.__name__)
        names = _FIELDS[t] = tuple(f.name for f in dataclasses.fields(t))
    return {name: plain(getattr(value, name)) for name in names}
