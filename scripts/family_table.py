#!/usr/bin/env python3
"""Write the family table of docs/FAMILIES.md from the registry (kernelcache/plan/families/).

    python scripts/family_table.py          # rewrite the table between the markers
    python scripts/family_table.py --check  # exit 1 when the committed table differs
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "FAMILIES.md"
BEGIN, END = "<!-- family table: scripts/family_table.py -->\n", "<!-- end of the family table -->\n"


def rendered(text: str) -> str:
    """``text`` with the registry's table between the markers."""
    from kernelcache.plan.families import table

    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + BEGIN + table() + END + tail


def main() -> int:
    text = DOC.read_text()
    want = rendered(text)
    if "--check" in sys.argv[1:]:
        return 0 if want == text else 1
    DOC.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
