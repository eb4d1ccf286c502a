"""notebooks/analysis.ipynb runs top to bottom on the results the test suite produced, and
writes its figures. (Runs after the end-to-end tests, which leave results/tests/.)"""

import os

import nbformat
from nbclient import NotebookClient

from tests.conftest import ROOT, run_harness

FIGURES = ["ttft_and_transfer_vs_prompt_len.png", "gbps_vs_bytes.png", "messages_vs_transfer_ms.png"]


def test_analysis_notebook_runs_and_saves_figures(results_dir, tmp_path):
    if not list(results_dir.rglob("requests.jsonl")):  # run alone: make results first
        run_harness(results_dir / "notebook-input", "sampling.max_tokens=4")
    nb = nbformat.read(ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    os.environ["HARNESS_RESULTS"] = str(results_dir)
    os.environ["HARNESS_FIGURES"] = str(tmp_path)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    finally:
        del os.environ["HARNESS_RESULTS"], os.environ["HARNESS_FIGURES"]
    for name in FIGURES:
        assert (tmp_path / name).stat().st_size > 5000, name
