"""Which strategy wins on which link: the table of TTFT overhead [95% interval], the prefill's
token, transfer and KV-ready times per prompt length, link and strategy, from run directories of
strategies run on the same machine and across shaped links (harness/report/link.py), the winner
of each cell, the crossovers (two strategies changing order between adjacent link speeds), and
the figure of TTFT overhead against link speed.

    python -m harness -m link=veth transport=gloo strategy=fused,layerwise link.rate_gbit=0.1,1,10 \\
        workload=synthetic workload.prompt_len=1024 workload.num_prompts=8 hydra.sweep.dir=OUT/links
    python -m harness -m strategy=fused,layerwise workload=synthetic workload.prompt_len=1024 \\
        workload.num_prompts=8 hydra.sweep.dir=OUT/same_machine
    python scripts/link_report.py OUT [--out OUT/link_report.md] [--figure OUT/ttft_vs_link.png]

Benchmark runs (scripts/bench_strategies.py ... -- link=veth link.rate_gbit=10 transport=gloo, each
link's benchmark in OUT/<its name>/; on a GPU transport=nixl) cover several prompt lengths in one
run: a row per length.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.report.link import (  # noqa: E402
    by_prompt_length,
    crossovers,
    link_table,
    plot_ttft_against_link,
    to_markdown,
    winners,
)
from harness.report.load import load_requests, load_runs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run or sweep directories")
    ap.add_argument("--out", help="write the markdown (table and winners) here too")
    ap.add_argument("--figure", help="draw the figure into this PNG")
    args = ap.parse_args()
    runs = load_runs(*args.runs)
    if runs.empty:
        print(f"no runs under {' '.join(args.runs)}", file=sys.stderr)
        return 2
    table = link_table(by_prompt_length(runs, load_requests(*args.runs)))
    crossed = crossovers(table) or ["none: every pair keeps its order from link to link"]
    text = (to_markdown(table) + "\n\nWinners:\n\n" + "\n".join(f"- {w}" for w in winners(table))
            + "\n\nCrossovers:\n\n" + "\n".join(f"- {c}" for c in crossed))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        axes = plot_ttft_against_link(table)
        axes[0].figure.tight_layout()
        axes[0].figure.savefig(args.figure, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
