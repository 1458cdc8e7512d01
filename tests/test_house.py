"""The house rules that keep the code readable by the next engineer (issue 13): comments stand on
their own, and modules import along the pipeline only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[1]
OWN_TEXT = [*ROOT.glob("kernelcache/**/*.py"), *ROOT.glob("scripts/**/*"), *ROOT.glob("docs/*.md"),
            *ROOT.glob("cache-manifests/*.toml"), ROOT / "README.md"]


def test_comments_cite_nothing_outside_the_repository():
    """Research notes are not in the repository: a comment states the fact (and links upstream)."""
    found = []
    for path in OWN_TEXT:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "shared/research" in line or "§" in line or re.search(r"\b[\w-]+\.md §", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
