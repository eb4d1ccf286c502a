"""The console script `disagg-harness` (pyproject's [project.scripts]) is `python -m harness`,
from any directory: it finds the project's configs and runs the same checks."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a process that imports vLLM

SCRIPT = Path(sys.executable).parent / "disagg-harness"


@pytest.mark.skipif(not SCRIPT.exists(), reason="the project is not installed in this environment (make setup)")
def test_the_console_script_composes_the_config_and_checks_input_from_anywhere(tmp_path):
    shown = subprocess.run([str(SCRIPT), "--cfg", "job", "strategy=layerwise", "transport=gloo"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "name: layerwise" in shown.stdout and "kind: gloo" in shown.stdout
    bad = subprocess.run([str(SCRIPT), f"hydra.run.dir={tmp_path / 'run'}", "device=cpu", "workload=synthetic",
                          "workload.num_prompts=0"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "workload.num_prompts" in bad.stderr
