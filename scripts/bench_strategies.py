"""Every strategy over a range of prompt lengths, against the machine's copy bandwidth measured in
the same run (harness/benchmark.py says what it runs and writes):

    python scripts/bench_strategies.py [--experiment cpu_bench] [--two-gpus] [--out DIR] [-- harness overrides ...]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project, also where it is not installed
from harness.benchmark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
