"""What an exercise process runs: ``Task`` records, planned here and run by exercise/worker.py."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Task:
    """``module:function`` plus keyword arguments; the function returns a JSON-able summary."""

    call: str
    kwargs: dict = field(default_factory=dict)
    label: str = ""
