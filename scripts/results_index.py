"""Write results/FINDINGS.md (the headline figures of results/headlines.yaml, each read again from
its run directory's records) and results/INDEX.md (every committed run directory with its date,
device, model, strategy, status, schema version, git sha and the documents citing it).

    python scripts/results_index.py           # write both
    python scripts/results_index.py --check   # write nothing; exit 1 with one line per problem: a headline's
                                              # run directory gone or its records giving another figure,
                                              # FINDINGS.md or INDEX.md not what this writes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.results_index import PROJECT_ROOT, problems, write  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 when a headline does not hold or a file is not current")
    args = ap.parse_args()
    if args.check:
        found = problems()
        for line in found:
            print(f"error: {line}", file=sys.stderr)
        return 1 if found else 0
    try:
        for path in write():
            print(path.relative_to(PROJECT_ROOT))
    except ValueError as e:  # a headline that does not hold, an archived or renamed entry that is wrong
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
