"""What a GPU check sees of an exercise run natively: the values an exercise hands on at named points.

An exercise calls ``seen(point, **values)`` where a check may want to look (a step's start, a sampler's output);
with no watcher, as in every build, that is a loop over an empty list. A check (tests/gpu_checks/) watches
with ``watching(callback)`` and gets ``callback(point, values)``: it times, digests or records what it needs,
and calls the exercise's public entry point as the build does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

_watchers: list[Callable[[str, dict], None]] = []


def seen(point: str, **values) -> None:
    """Hand ``values`` to every watcher (none: nothing happens)."""
    for watcher in _watchers:
        watcher(point, values)


@contextmanager
def watching(callback: Callable[[str, dict], None]) -> Iterator[None]:
    """``callback(point, values)`` for every ``seen`` while the block runs."""
    _watchers.append(callback)
    try:
        yield
    finally:
        _watchers.remove(callback)
