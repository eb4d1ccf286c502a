"""Serving without instances: the config `python -m harness` composes on CPU for a serving
instance's small KV cache, resolved, and request rows of a serving run with the summary
harness/records/serve_summary.py makes of them."""

import json
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from harness.records.schema import ServeRow, field_names
from harness.records.serve_summary import serve_summary
from harness.serving.serve import run_facts
from harness.settings import settle
from tests.conftest import ROOT


def config(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["device=cpu", "engine.max_model_len=512", "engine.kv_cache_gib=0.25",
                                           *overrides])
    OmegaConf.resolve(cfg)
    return cfg


def serve_summary_of(rows: list[dict], records_expected: bool = False) -> dict:
    """serve_summary over these rows (their paths say which file each goes in)."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["path"] == "disagg"))
        (d / "baseline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["path"] != "disagg"))
        cfg = config("runner=serve", "strategy=fused", "serve.request_rate=4.0", "serve.max_concurrency=null",
                     "slo.ttft_ms=null", "slo.tpot_ms=null")
        return serve_summary(d, run_facts(settle(cfg, "cpu"), "r", external=False), status="ok", error=None, timings={},
                             kv_usage={"prefill": 0.0, "decode": 0.0}, repeats=cfg.serve.repeats,
                             probe_interval_s=cfg.serve.probes.interval_s, records_expected=records_expected)


def serve_rows(n: int = 3) -> list[dict]:
    marks = {"disagg": (4.0, 6.0), "baseline": (None, None), "baseline_repeat": (None, None)}
    return [dict(dict.fromkeys(field_names(ServeRow)), path=path, status="ok", sent_s=0.1 * i, arrival_s=0.1 * i,
                 ttft_ms=5.0, request_idx=i,
                 prefill_ttft_ms=marks[path][0], decode_ttft_ms=marks[path][1], tpot_ms=1.0, e2e_ms=20.0,
                 itl_ms=[1.0], output_len=4, meets_slo=True, match=True, digest_match=True, kv_recomputed=False,
                 decode_preemptions=0)
            for path in ("disagg", "baseline", "baseline_repeat") for i in range(n)]


# the shared test deployment (tests/test_serve_deployment.py), one of the README's harness.serving.deploy commands
DEPLOY = ("strategy=fused", "serve.prefill_instances=2", "serve.decode_instances=2", "serve.deploy_baseline=true")
