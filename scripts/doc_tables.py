"""The documents' tables written from what they describe: results/README.md's tables of the rows'
fields (harness/records/fields.py: requests.jsonl, baseline.jsonl, runner=serve's rows) and
docs/configuration.md's table of the scenarios (conf/scenario/*.yaml: what each provokes, what a
correct strategy shows, what its run must show).

    python scripts/doc_tables.py           # write them
    python scripts/doc_tables.py --check   # exit 1 when a document's tables are not what this writes
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from omegaconf import OmegaConf  # noqa: E402

from harness import PROJECT_ROOT  # noqa: E402
from harness.records.schema import markdown_table  # noqa: E402

DOCUMENTS = [PROJECT_ROOT / "results" / "README.md", PROJECT_ROOT / "docs" / "configuration.md"]
BLOCK = re.compile(r"(<!-- (fields|scenarios):? ?(\w*)[^>]*-->\n)(.*?)(\n<!-- end \2 -->)", re.S)


def scenario_table() -> str:
    lines = ["| scenario | what it provokes | what a correct strategy shows | its run must show |",
             "| --- | --- | --- | --- |"]
    for path in sorted((PROJECT_ROOT / "conf" / "scenario").glob("*.yaml")):
        s = OmegaConf.load(path).scenario
        expect = ", ".join(f"`{k} {v}`" for k, v in (s.get("expect") or {}).items()) or "-"
        lines.append(f"| `{s.name}` | {s.provokes} | {s.shows} | {expect} |")
    return "\n".join(lines)


def rendered(text: str) -> str:
    """text with every marked table written again from what it describes."""
    return BLOCK.sub(lambda m: m.group(1) + (markdown_table(m.group(3)) if m.group(2) == "fields" else
                                             scenario_table()) + m.group(5), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is not current")
    args = ap.parse_args()
    stale = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        if rendered(text) != text:
            stale.append(doc)
            if not args.check:
                doc.write_text(rendered(text))
                print(doc.relative_to(PROJECT_ROOT))
    if args.check and stale:
        names = ", ".join(str(d.relative_to(PROJECT_ROOT)) for d in stale)
        print(f"not current: {names}: python scripts/doc_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
