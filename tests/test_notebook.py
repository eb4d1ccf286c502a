"""notebooks/analysis.ipynb runs top to bottom through harness.report.load and writes its figures,
on the committed results alone: schema version 1 (CPU and GPU) up to the current one
(results/gpu/2026-12-02-s15, whole run directories), so that it does not depend on which tests ran
before it."""

import json
import os

import nbformat
import pytest
from nbclient import NotebookClient

from harness.records.schema import SCHEMA_VERSION
from tests.conftest import ROOT

FIGURES = ["ttft_and_transfer_vs_prompt_len.png", "gbps_vs_bytes.png", "ttft_overhead_parts.png",
           "messages_vs_transfer_ms.png", "serve_latency_vs_rate.png", "serve_pareto.png",  # serve: committed runs
           "lossy_cost_vs_bytes.png",  # results/cpu/2026-12-04-s2[12]-lossy, results/gpu/2026-12-04-s22/lossy
           "ttft_vs_link.png"]  # results/cpu/2026-12-04-s22-link


@pytest.mark.slow  # about 2 minutes on the 2-core machine: in make test, not in make test-fast
def test_analysis_notebook_runs_and_saves_figures(tmp_path):
    dirs = [ROOT / "results" / "cpu", ROOT / "results" / "gpu"]
    current = [p for d in dirs for p in d.rglob("summary.json")
               if json.loads(p.read_text()).get("schema_version") == SCHEMA_VERSION]
    assert current, "no committed run of the current schema version: the notebook would not be tested on it"
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
