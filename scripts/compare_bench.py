"""The GPU TTFT benchmark's regression guard, a new benchmark directory against a reference
(harness/report/compare.py says how it judges):

    python scripts/compare_bench.py NEW_DIR REF_DIR [--metrics M ...] [--slack-ms X]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project, also where it is not installed
from harness.report.compare import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
