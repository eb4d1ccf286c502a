"""Trackers as the configs choose them (conf/tracking/*.yaml name their class as `_target_`),
and real wandb logging in offline mode (no network): the offline run directory holds the config,
the summary metrics and the per-request table."""

import inspect
import json
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness import resolvers
from harness.tracking import NoTracking, WandbTracking, make_tracker
from tests.conftest import SLOW

ROOT = Path(__file__).resolve().parent.parent
resolvers.register()


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_no_tracking_by_default(tmp_path):
    assert type(make_tracker(composed(), tmp_path, "r")) is NoTracking


def test_a_tracking_config_names_a_class_that_takes_its_keys():
    cfg = composed("tracking=wandb", "tracking.tags=[ci]")
    assert cfg.tracking._target_ == "harness.tracking.WandbTracking" and cfg.tracking.mode == "offline"
    takes = set(inspect.signature(WandbTracking).parameters)
    assert {k for k in cfg.tracking if k != "_target_"} <= takes


@SLOW  # wandb's offline run: about 4 s
def test_wandb_offline_run_has_summary_and_table(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = composed("strategy=fused", "tracking=wandb", "tracking.project=test", "tracking.tags=[ci]")
    t = make_tracker(cfg, tmp_path, "run-1")
    assert isinstance(t, WandbTracking)
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
