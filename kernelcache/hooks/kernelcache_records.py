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
