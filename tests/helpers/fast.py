"""A pytest plugin for the fast tier (``pytest -m fast``): tests that need no Triton, torch or compiler.

With ``-m fast`` only the test modules that mark something ``fast`` are collected, and this interpreter
refuses to import triton, torch, vLLM and FlashInfer, so a fast test that reaches for them fails instead
of quietly making the quick loop slow.
"""

from __future__ import annotations

import importlib.abc
import sys
from pathlib import Path

import pytest

BLOCKED = ("triton", "torch", "vllm", "flashinfer")


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} imported by a test of the fast tier (-m fast): mark it otherwise")
        return None


def fast_only(config: pytest.Config) -> bool:
    return (config.option.markexpr or "").strip() == "fast"


def pytest_configure(config: pytest.Config) -> None:
    if fast_only(config) and not any(m in sys.modules for m in BLOCKED):
        sys.meta_path.insert(0, _Refuse())


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m fast``, a test module with no fast test is not even imported."""
    if fast_only(config) and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return "mark.fast" not in collection_path.read_text(errors="replace") or None
    return None
