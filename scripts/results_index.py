"""Write results/INDEX.md: every committed run directory (results/cpu, results/gpu) with its date,
device, model, strategy, status, schema version, git sha and the READMEs citing it, after a short
table of the current headline figures (tools/results_index.py keeps them).

    python scripts/results_index.py           # write it
    python scripts/results_index.py --check   # exit 1 when the committed INDEX.md differs from what this writes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.results_index import INDEX, PROJECT_ROOT, is_current, write  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when INDEX.md is not current")
    args = ap.parse_args()
    try:
        if args.check:
            if is_current():
                return 0
            print(f"{INDEX} is not current: run python scripts/results_index.py", file=sys.stderr)
            return 1
        print(write().relative_to(PROJECT_ROOT))
    except ValueError as e:  # a headline, archived or renamed entry that does not hold
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
