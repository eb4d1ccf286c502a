"""Real wandb logging in offline mode (no network): the offline run directory holds the config,
the summary metrics and the per-request table."""

import json
import time

import pytest
from omegaconf import OmegaConf

from harness.tracking import NoTracking, make_tracker


def test_no_tracking_by_default(tmp_path):
    cfg = OmegaConf.create({"tracking": {"backend": "none"}})
    assert type(make_tracker(cfg, tmp_path, "r")) is NoTracking


def test_wandb_offline_run_has_summary_and_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = OmegaConf.create({"strategy": {"name": "fused"},
                            "tracking": {"backend": "wandb", "mode": "offline", "project": "test",
                                         "entity": None, "group": None, "tags": ["ci"]}})
    t = make_tracker(cfg, tmp_path, "run-1")
    t.log_summary({"match_rate": 1.0, "ttft_ms_p50": 12.5, "status": "ok", "timings": {"startup_s": 3.0}})
    t.log_requests([{"prompt_idx": 0, "ttft_ms": 12.5, "match": True, "token_ids": [1, 2]},
                    {"prompt_idx": 1, "ttft_ms": 13.0, "match": True, "token_ids": [3]}])
    t.finish()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    run = runs[0]
    (log,) = run.glob("run-*.wandb")  # wandb's binary log: config, summary and history records
    keys = (b"match_rate", b"ttft_ms_p50", b"timings/startup_s", b"fused", b"requests")
    deadline = time.monotonic() + 20  # wandb's service may still be writing its last records
    while not all(k in log.read_bytes() for k in keys) and time.monotonic() < deadline:
        time.sleep(0.5)
    raw = log.read_bytes()
    for key in keys:
        assert key in raw, key
    (table,) = run.glob("files/media/table/requests_*.table.json")
    t = json.loads(table.read_text())
    assert "ttft_ms" in t["columns"] and "token_ids" not in t["columns"]
    assert [row[t["columns"].index("ttft_ms")] for row in t["data"]] == [12.5, 13.0]
