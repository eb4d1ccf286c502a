"""Records, summaries, workloads and the composed config, without engines."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness import resolvers
from harness.records.files import JsonlWriter, read_jsonl
from harness.records.schema import SCHEMA_VERSION
from harness.records.summary import summarize
from harness.records.tables import format_run_table
from harness.report.load import load_requests, load_runs
from harness.report.sweep import format_rows, sweep_rows
from harness.resolvers import built_in_strategies
from harness.workload import Prompt, Workload, WorkloadError, jsonl, synthetic, text_prompts
from tests.helpers.tokenizer import FakeTokenizer

ROOT = Path(__file__).resolve().parent.parent
resolvers.register()


def test_jsonl_rows_are_on_disk_as_soon_as_written(tmp_path):
    w = JsonlWriter(tmp_path / "r.jsonl")
    w.write({"a": 1})
    assert read_jsonl(tmp_path / "r.jsonl") == [{"a": 1}]  # before close: a crash keeps it
    w.write({"a": 2})
    w.close()
    assert [r["a"] for r in read_jsonl(tmp_path / "r.jsonl")] == [1, 2]


def test_summary_counts_mismatches_and_digest_failures():
    rows = [{"match": True, "digest_match": True, "bytes": 100, "transfer_ms": 1.0, "ttft_ms": 10.0},
            {"match": False, "digest_match": False, "bytes": 300, "transfer_ms": 1.0, "ttft_ms": 30.0},
            {"match": True, "digest_match": None, "bytes": 0, "transfer_ms": None, "ttft_ms": 20.0}]
    s = summarize(rows)
    assert s["requests"] == 3 and s["mismatches"] == 1 and abs(s["match_rate"] - 2 / 3) < 1e-9
    assert s["digest_checked"] == 2 and s["digest_failures"] == 1
    assert s["ttft_ms_p50"] == 20.0 and s["transfer_gbps"] == 400 / 2.0 / 1e6
    assert s["ttft_ms_p50_lo"] <= 20.0 <= s["ttft_ms_p50_hi"] and s["ttft_ms_p50_lo"] < s["ttft_ms_p50_hi"]
    assert s["gpu_ms_p50"] is None and s["gpu_ms_p50_lo"] is None  # not measured on the CPU
    assert s["schema_version"] == 1  # rows without schema_version are version 1
    assert summarize([{**r, "schema_version": SCHEMA_VERSION} for r in rows])["schema_version"] == SCHEMA_VERSION
    table = format_run_table([{**rows[0], "prompt_idx": 0, "prompt_len": 5}], s).splitlines()
    assert table[0].split()[:3] == ["#", "prompt", "out"] and table[1].split()[:3] == ["0", "5", "-"]
    assert "match 2/3  digest failures 1/2  ttft p50 20.0 ms" in table[-1]


def test_workloads_and_their_errors(tmp_path):
    tok = FakeTokenizer()
    w = synthetic("s", prompt_len=7, num_prompts=3, tokenizer=tok, seed=1)
    assert [len(p.token_ids) for p in w.prompts] == [7, 7, 7]
    assert w.prompts[0].token_ids == synthetic("s", 7, 3, tok, seed=1).prompts[0].token_ids
    assert all(t not in (0, 1) for p in w.prompts for t in p.token_ids)
    w = text_prompts("t", ["ab", "hello"], tok, prompt_len=5)
    assert [len(p.token_ids) for p in w.prompts] == [5, 5]
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hi"}\n{"prompt": [5, 6, 7]}\n')
    assert [p.token_ids for p in jsonl("j", str(f), tok).prompts] == [tok("hi").input_ids, [5, 6, 7]]
    f.write_text('{"text": "hi"}\n')
    with pytest.raises(WorkloadError, match="p.jsonl:1"):
        jsonl("j", str(f), tok)
    with pytest.raises(WorkloadError, match="not found"):
        jsonl("j", str(tmp_path / "none.jsonl"), tok)
    with pytest.raises(WorkloadError, match=r"engine.max_model_len >= 12"):
        Workload("w", [Prompt(0, [1] * 10)]).check_fits(max_model_len=11, max_tokens=2)


def test_config_composes_with_every_group():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config")
        assert cfg.strategy.name == "fused" and cfg.workload.name == "smoke" and cfg.device.type == "auto"
        assert Path(cfg.model.path) == ROOT / "models" / "tiny-llama"
        for strategy in (*built_in_strategies(), "vllm_example"):
            c = compose("config", overrides=[f"strategy={strategy}", "workload=synthetic", "device=cpu"])
            assert c.strategy.name == strategy and c.workload.prompt_len == 256
        # a strategy group may resize the engine (full_cache shrinks the cache it sends whole)
        assert compose("config", overrides=["strategy=full_cache"]).engine.kv_cache_gib < 1
        assert compose("config", overrides=["strategy=full_cache", "engine.kv_cache_gib=2"]).engine.kv_cache_gib == 2


def _fake_run(d: Path, status="ok", block_size=32, version=None):
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(f"- strategy=fused\n- engine.block_size={block_size}\n")
    (d / ".hydra" / "config.yaml").write_text(
        f"engine:\n  block_size: {block_size}\n  extra: {{}}\nworkload:\n  concurrency: 2\n"
        "model:\n  path: ${project_root:}/models/m\nstrategy:\n  name: fused\n  requires: [a, b]\n")
    (d / "meta.json").write_text(json.dumps({"versions": {"vllm": "0.32.0", "torch": "2.13", "git_sha": "abc"},
                                             "config": {"model": {"path": "/root/models/m"}}}))
    (d / "summary.json").write_text(json.dumps({"status": status, "strategy": "fused", "requests": 1,
                                                "timings": {"startup_s": 3.0}, "ttft_ms_p50": 1.0,
                                                "ttft_ms_p50_lo": 0.5, "ttft_ms_p50_hi": 2.0}))
    row = {"prompt_len": 5, "ttft_ms": 1.0, "token_ids": [1], "base_token_ids": [1]}
    (d / "requests.jsonl").write_text(json.dumps(row if version is None else {**row, "schema_version": version}) + "\n")


def test_results_load_into_pandas_with_config_columns_and_sweep_table(tmp_path):
    _fake_run(tmp_path / "sweep" / "0_a", version=SCHEMA_VERSION)
    _fake_run(tmp_path / "sweep" / "1_b", status="engine_failed", block_size=64)
    df = load_requests(tmp_path)
    assert len(df) == 2 and "token_ids" not in df and set(df["vllm"]) == {"0.32.0"}
    assert list(df["schema_version"]) == [SCHEMA_VERSION, 1]  # the second was written before versions
    assert list(df["engine.block_size"]) == [32, 64] and set(df["workload.concurrency"]) == {2}
    assert df.groupby("engine.block_size").size().to_dict() == {32: 1, 64: 1}
    assert set(df["model.path"]) == {"/root/models/m"}  # resolved by the run (meta.json), not here
    assert set(df["strategy.requires"]) == {("a", "b")} and df["transfer_ms"].isna().all()
    runs = load_runs(tmp_path)
    assert list(runs["timings.startup_s"]) == [3.0, 3.0] and list(runs["engine.block_size"]) == [32, 64]
    rows = sweep_rows(tmp_path / "sweep")
    assert [r["status"] for r in rows] == ["ok", "engine_failed"]
    assert rows[0]["overrides"] == "strategy=fused engine.block_size=32"
    table = format_rows(rows)
    assert "engine_failed" in table and "1.0 [0.5, 2.0]" in table  # the jobs' p50s with their intervals


def test_a_run_killed_before_its_summary_still_loads(tmp_path):
    _fake_run(tmp_path / "run", version=SCHEMA_VERSION)
    (tmp_path / "run" / "summary.json").unlink()
    assert len(load_requests(tmp_path)) == 1
    runs = load_runs(tmp_path)
    assert runs["status"].tolist() == [None] and runs["schema_version"].tolist() == [SCHEMA_VERSION]
