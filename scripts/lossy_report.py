"""The accuracy-cost table of lossy strategies against fused, from run directories (a sweep of
fused and the lossy strategies run together: docs/strategies.md, "Lossy strategies"), as markdown, and its
figure (accuracy cost against bytes saved).

    python -m harness -m hydra.sweep.dir=OUT strategy=fused,fused_fp8,fused_int8,fused_int4 \\
        workload=corpus workload.prompt_len=256,1024 workload.num_prompts=16 sampling.max_tokens=32
    python scripts/lossy_report.py OUT [--figure OUT/lossy.png] [--out OUT/lossy.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.report.accuracy import accuracy_table, plot_cost_against_bytes, to_markdown  # noqa: E402
from harness.report.load import load_runs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run or sweep directories")
    ap.add_argument("--out", help="write the markdown table here too")
    ap.add_argument("--figure", help="draw the figure into this PNG")
    args = ap.parse_args()
    runs = load_runs(*args.runs)
    if runs.empty:
        print(f"no runs under {' '.join(args.runs)}", file=sys.stderr)
        return 2
    table = to_markdown(accuracy_table(runs))
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        ax = plot_cost_against_bytes(accuracy_table(runs))
        ax.figure.tight_layout()
        ax.figure.savefig(args.figure, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
