#!/usr/bin/env python3
"""Write the family table and the family x vLLM-release table of docs/FAMILIES.md from the registry
(kernelcache/plan/families/).

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
RELEASES = "<!-- release table: scripts/family_table.py -->\n", "<!-- end of the release table -->\n"


def rendered(text: str) -> str:
    """``text`` with the registry's tables between their markers."""
    from kernelcache.plan.families import release_table, table

    for (begin, end), body in (((BEGIN, END), table()), (RELEASES, release_table())):
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + begin + body + end + tail
    return text


def main() -> int:
    text = DOC.read_text()
    want = rendered(text)
    if "--check" in sys.argv[1:]:
        return 0 if want == text else 1
    DOC.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
