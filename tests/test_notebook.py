"""notebooks/analysis.ipynb runs top to bottom through harness.results and writes its figures:
on the committed results (schema version 1, CPU and GPU) and on the runs the end-to-end tests
left in results/tests/ when there are any (the current schema; they run before this test)."""

import os

import nbformat
from nbclient import NotebookClient

from tests.conftest import ROOT

FIGURES = ["ttft_and_transfer_vs_prompt_len.png", "gbps_vs_bytes.png", "ttft_overhead_parts.png",
           "messages_vs_transfer_ms.png", "serve_latency_vs_rate.png", "serve_pareto.png"]  # serve: committed runs


def test_analysis_notebook_runs_and_saves_figures(results_dir, tmp_path):
    dirs = [ROOT / "results" / "cpu", ROOT / "results" / "gpu"]
    if list(results_dir.rglob("requests.jsonl")):
        dirs.append(results_dir)
    nb = nbformat.read(ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    os.environ["HARNESS_RESULTS"] = os.pathsep.join(map(str, dirs))
    os.environ["HARNESS_FIGURES"] = str(tmp_path)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    finally:
        del os.environ["HARNESS_RESULTS"], os.environ["HARNESS_FIGURES"]
    outputs = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any("requests from" in t and str(dirs[0]) in t for t in outputs)
    for name in FIGURES:
        assert (tmp_path / name).stat().st_size > 5000, name
