"""Slim run directories before committing them under results/cpu or results/gpu: what can be made
again is removed, the records are gzipped, machine paths in logs become placeholders
(tools/results_slim.py lists the rules; tests/test_results_index.py holds the committed tree to
them). Then `python scripts/results_index.py` writes results/INDEX.md (and FINDINGS.md) again; each run
directory's own files stay within 256 KiB and results/ within 15 MB (tools/results_index.py).

    python scripts/slim_results.py results/gpu/2026-12-04-s20            # every rule
    python scripts/slim_results.py --dry-run results/gpu/2026-12-04-s20  # what it would change
    python scripts/slim_results.py --rule gzip --rule figures DIR          # some rules only
    python scripts/slim_results.py --prompts DIR    # a committed benchmark's prompts.jsonl, made again
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.results_slim import RULES, slim, write_prompts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--rule", action="append", choices=RULES, help="only these rules (default: all, in order)")
    ap.add_argument("--dry-run", action="store_true", help="list what each rule would change; change nothing")
    ap.add_argument("--prompts", action="store_true",
                    help="write each DIR's prompts.jsonl again (a benchmark of scripts/bench_strategies.py)")
    args = ap.parse_args()
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.prompts:
        for d in args.dirs:
            try:
                print(write_prompts(d))
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        return 0
    rules = tuple(r for r in RULES if r in (args.rule or RULES))
    for d in args.dirs:
        for rule, paths in slim(d, rules, dry_run=args.dry_run).items():
            for p in paths:
                print(f"{rule}: {p}")
            print(f"{d}: {rule}: {len(paths)}{' (dry run)' if args.dry_run else ''}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
