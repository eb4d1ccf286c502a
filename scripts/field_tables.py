"""results/README.md's tables of the rows' fields, written from their declarations
(harness/records/fields.py): requests.jsonl, baseline.jsonl and runner=serve's rows.

    python scripts/field_tables.py           # write them into results/README.md
    python scripts/field_tables.py --check   # exit 1 when results/README.md's tables are not what this writes
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness import PROJECT_ROOT  # noqa: E402
from harness.records.schema import markdown_table  # noqa: E402

README = PROJECT_ROOT / "results" / "README.md"
BLOCK = re.compile(r"(<!-- fields: (\w+)[^>]*-->\n)(.*?)(\n<!-- end fields -->)", re.S)


def rendered(text: str) -> str:
    """text with every marked table written again from the declarations."""
    return BLOCK.sub(lambda m: m.group(1) + markdown_table(m.group(2)) + m.group(4), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is not current")
    args = ap.parse_args()
    text = README.read_text()
    new = rendered(text)
    if args.check:
        if new != text:
            print(f"{README} is not current: python scripts/field_tables.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    print(README.relative_to(PROJECT_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
