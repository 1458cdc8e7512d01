"""What every record kernelcache keeps rests on (standard library only): file stamps and JSON-lines logs.

A record kept to skip work later (a fingerprint's environment key, a checked install, served variables, Triton's
kept key and tool outputs) holds the stamps of the files it was computed from, and is used again only while each
stamp is what it was. ``CONTENT``, (size, mtime_ns, ctime_ns), changes when a file is rewritten or replaced (the
ctime cannot be set back); ``st_ino`` and ``st_dev`` in front say which file it is, where a copy with the same
stamps must not count.

A log (the compile log, the overlay's miss log) is JSON lines appended with one ``write`` each, so threads and
processes can share one; a reader skips the torn last line of a killed writer. ``json`` is imported where used:
sitecustomize imports this module in every served process.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported: this module is read in every served process
if TYPE_CHECKING:
    from collections.abc import Iterable

CONTENT = ("st_size", "st_mtime_ns", "st_ctime_ns")
SAME_INODE = ("st_ino", *CONTENT)
SAME_FILE = ("st_dev", "st_ino", *CONTENT)


def stamp(path: str | os.PathLike, fields: tuple[str, ...] = CONTENT) -> list[int] | None:
    """The ``fields`` of ``os.stat(path)`` (links followed), in order; None when it cannot be stat-ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [getattr(st, name) for name in fields]


def append_line(path: str | os.PathLike, record: dict) -> None:
    """Append ``record`` to the log at ``path`` as one JSON line, in one ``write`` (values JSON cannot hold become
    strings)."""
    import json

    line = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_lines(path: str | os.PathLike) -> list[dict]:
    """Every complete record of the log at ``path`` (``records``). ``OSError`` when it cannot be read."""
    with open(path, encoding="utf-8") as handle:
        return records(handle)


def records(lines: Iterable[str]) -> list[dict]:
    """The records of a log's ``lines``: each line that holds a JSON object (a torn last line of a killed writer is
    skipped)."""
    import json

    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            found.append(record)
    return found


def sha256_hex(data: bytes) -> str:
    """``hashlib.sha256(data).hexdigest()``, from CPython's own ``_sha2`` where it is there: ``import hashlib`` loads
    OpenSSL's libcrypto first, 10-25 ms of a no-op install's pod start on 2 cores."""
    try:
        from _sha2 import sha256
    except ImportError:  # another interpreter, or a CPython built without it
        from hashlib import sha256
    return sha256(data).hexdigest()


# -- JSON without the json package, for the no-op install's record ------------------------------------------------
# ``import json`` imports ``re`` and ``enum``: 20-35 ms of a pod start's no-op install on 2 cores, more than the
# rest of its work. The json package's own C scanner and encoder (``_json``, which ``json.decoder`` and
# ``json.encoder`` wrap) read and write the same documents without them; where ``_json`` is missing the package
# answers.


class _Scanning:
    """What ``_json.make_scanner`` reads from a ``json.JSONDecoder`` (``json.loads``'s defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__
    memo: dict = {}


def json_loads(text: str):
    """``json.loads(text)`` (a ``ValueError`` for what is not one JSON document)."""
    try:
        from _json import make_scanner
    except ImportError:
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(" \t\n\r"))
    try:
        value, end = make_scanner(_Scanning())(text, start)
    except StopIteration:
        raise ValueError("not a JSON document") from None
    if text[end:].strip(" \t\n\r"):
        raise ValueError("extra data after the JSON document")
    return value


def json_dumps_sorted(value) -> str:
    """``json.dumps(value, sort_keys=True)``, the same text."""
    try:
        from _json import encode_basestring_ascii, make_encoder
    except ImportError:
        import json

        return json.dumps(value, sort_keys=True)
    if isinstance(value, str):
        return encode_basestring_ascii(value)

    def refuse(item):
        raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")

    return "".join(make_encoder({}, refuse, encode_basestring_ascii, None, ": ", ", ", True, False, True)(value, 0))
