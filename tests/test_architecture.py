"""The architecture holds itself (tools/check_architecture.py, run by `make lint`): imports go down
the layers (entry points, runners, reports, core, records, transfer_strategies), offline and
serving never import each other, reports never import a runner, transfer_strategies never imports
harness, and no module of harness/, transfer_strategies/ or tools/ is over 400 lines. Shown to
fail on each kind of violation, planted in a copy of the tree."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import check_architecture

ROOT = Path(__file__).resolve().parent.parent


def test_the_tree_keeps_its_layers_and_its_module_sizes():
    assert check_architecture.violations(ROOT) == []


@pytest.fixture
def tree(tmp_path):
    for package in check_architecture.PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize(("module", "line", "said"), [
    ("harness/offline/run.py", "from harness.serving.load import LoadSpec", "the offline layer may not import the "
                                                                            "serving layer"),
    ("harness/report/link.py", "from harness.offline.rows import disagg_row", "the report layer may not import the "
                                                                              "offline layer"),
    ("transfer_strategies/fused.py", "from harness.records.stats import percentile", "the connectors layer may not "
                                                                                    "import the records layer"),
    ("harness/records/summary.py", "    from harness.checks import decode_submit", "the records layer may not import "
                                                                                  "the core layer"),
    ("harness/workload.py", "import harness.serving.router", "the core layer may not import the serving layer"),
])
def test_an_import_up_the_layers_fails_the_check(tree, module, line, said):
    path = tree / module
    text = path.read_text()
    # a lazy import is a dependency too: planted inside a function where the line is indented
    planted = text + (f"\n\ndef _planted():\n{line}\n" if line.startswith(" ") else f"\n{line}\n")
    path.write_text(planted)
    found = check_architecture.violations(tree)
    assert len(found) == 1 and found[0].startswith(f"{module}:") and said in found[0]


def test_a_module_over_400_lines_fails_the_check_and_make_lint(tree):
    path = tree / "harness" / "records" / "stats.py"
    path.write_text(path.read_text() + "# padding\n" * 400)
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "check_architecture.py"), str(tree)],
                       capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stderr.startswith("harness/records/stats.py: ") and "over 400: split it by what it owns" in p.stderr
