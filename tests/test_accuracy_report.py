"""The lossy strategies' report (harness/report/accuracy.py) on a frame as load_runs gives it."""

import pandas as pd
import pytest

from harness.report.accuracy import accuracy_table, to_markdown


def run(strategy, prompt_len, bytes_p50, transfer_ms, codec=None, drop=0.0, model="tiny-llama", status="ok"):
    return {"strategy": strategy, "workload.prompt_len": prompt_len, "model": model, "device": "cpu",
            "bytes_p50": bytes_p50, "transfer_ms_p50": transfer_ms, "codec": codec, "accuracy_drop": drop,
            "requests": 8, "near_ties": 1, "status": status, "match_rate": 1 - drop, "baseline_self_match_rate": 1.0}


def test_each_strategy_is_compared_with_fused_at_its_model_device_and_prompt_length():
    runs = pd.DataFrame([
        run("fused", 256, 1000, 2.0), run("fused_int8", 256, 260, 4.0, "int8/block/64", 0.125),
        run("fused_int8", 256, 260, 6.0, "int8/block/64", 0.375),  # a second run of the same cell: pooled
        run("fused", 1024, 4000, 4.0), run("fused_fp8", 1024, 1040, 2.0, "fp8/block/64", status="mismatch"),
        run("fused", 256, 9999, 1.0, model="other"),  # no lossy run beside it: left out
        run("layerwise", 256, 1000, 1.0),  # neither lossy nor the reference: left out
        {**run("fused", 256, 500, 1.0, drop=0.5), "engines.decode.kv_cache_dtype": "fp8"},  # both engines FP8
    ])
    t = accuracy_table(runs)
    assert list(zip(t["strategy"], t["prompt_len"])) == [
        ("fused", 256), ("fused (kv_cache_dtype=fp8)", 256), ("fused_int8", 256), ("fused", 1024), ("fused_fp8", 1024)]
    assert t.iloc[1]["bytes_vs_fused"] == 0.5 and t.iloc[1]["accuracy_drop"] == 0.5
    t = t.drop(index=1).reset_index(drop=True)
    int8 = t.iloc[1]
    assert int8["runs"] == 2 and int8["requests"] == 16 and int8["accuracy_drop"] == pytest.approx(0.25)
    assert int8["bytes_vs_fused"] == pytest.approx(0.26) and int8["transfer_ms_vs_fused"] == pytest.approx(2.5)
    assert t.iloc[3]["bytes_vs_fused"] == pytest.approx(0.26) and t.iloc[3]["status"] == "mismatch"
    assert t.iloc[0]["codec"] == "-" and t.iloc[0]["bytes_vs_fused"] == 1.0
    md = to_markdown(t)
    assert md.count("\n") == 5 and "| fused_int8 | 256 | 2 | 16 | 0.75 | 1 | 2 | int8/block/64 |" in md
    assert "| KV bytes moved / fused's |" in md  # the declared headers (harness/records/fields.py)
