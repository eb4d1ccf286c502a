"""End to end on CPU with real vLLM engines: baseline, prefill and decode, KV moved by `fused`.

One harness run (module fixture) serves every test here: prompts of edge-case lengths around
the block size, two sharing a prefix, several in flight at once.
"""

import random

import psutil
import pytest

from tests.conftest import run_harness, write_token_prompts

BLOCK = 32
LENGTHS = [1, 5, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 1, 150]


def _prompts():
    rng = random.Random(1)
    prompts = [[rng.randrange(10, 4000) for _ in range(n)] for n in LENGTHS]
    prefix = [rng.randrange(10, 4000) for _ in range(2 * BLOCK)]
    prompts += [prefix + [rng.randrange(10, 4000) for _ in range(9)] for _ in range(2)]
    return prompts


@pytest.fixture(scope="module")
def fused_run(results_dir, tmp_path_factory):
    prompts = write_token_prompts(tmp_path_factory.mktemp("w") / "prompts.jsonl", _prompts())
    return run_harness(results_dir / "e2e-fused", "strategy=fused", "workload=jsonl",
                       f"workload.path={prompts}", "workload.concurrency=3", "engine.max_model_len=512",
                       "sampling.max_tokens=8")


def test_every_output_matches_the_baseline(fused_run):
    assert fused_run.code == 0, fused_run.stderr[-3000:]
    s = fused_run.summary
    assert s["status"] == "ok" and s["requests"] == len(_prompts())
    assert s["match_rate"] == 1.0 and s["mismatches"] == 0
    assert "match" in fused_run.stdout and "GB/s" in fused_run.stdout


def test_every_transfer_is_bit_identical(fused_run):
    rows = fused_run.jsonl("requests.jsonl")
    assert all(r["digest_match"] is True for r in rows)
    assert fused_run.summary["digest_failures"] == 0


def test_records_carry_latency_bytes_and_messages(fused_run):
    rows = {r["prompt_idx"]: r for r in fused_run.jsonl("requests.jsonl")}
    base = {r["prompt_idx"]: r for r in fused_run.jsonl("baseline.jsonl")}
    assert sorted(rows) == sorted(base) == list(range(len(_prompts())))
    per_block = None
    for i, r in rows.items():
        n = len(_prompts()[i])
        assert r["prompt_len"] == n and r["output_len"] == 8
        assert r["blocks"] == -(-(n - 1) // BLOCK)  # ceil: the blocks holding tokens [0, n-1)
        assert r["messages"] == 1  # fused: one message per request
        if r["blocks"]:
            per_block = per_block or r["bytes"] / r["blocks"]
            assert r["bytes"] == r["blocks"] * per_block
            assert r["transfer_ms"] > 0 and r["gbps"] > 0
        else:
            assert r["bytes"] == 0
        for k in ("ttft_ms", "e2e_ms", "base_ttft_ms", "base_e2e_ms", "prefill_ms"):
            assert r[k] > 0
        assert r["e2e_ms"] >= r["ttft_ms"] >= r["prefill_ms"]
    assert per_block and per_block > 0


def test_run_directory_has_config_versions_and_summary(fused_run):
    d = fused_run.run_dir
    assert (d / ".hydra" / "config.yaml").exists()
    import json

    meta = json.loads((d / "meta.json").read_text())
    assert meta["versions"]["vllm"] and meta["versions"]["torch"] and meta["versions"]["device"] == "cpu"
    assert "git_sha" in meta["versions"]
    s = fused_run.summary
    for k in ("ttft_ms_p50", "ttft_ms_p90", "e2e_ms_p50", "transfer_ms_p50", "transfer_gbps", "bytes_p50"):
        assert s[k] is not None


def test_no_engine_left_running(fused_run):
    for pid in fused_run.summary["engine_pids"].values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.fixture(scope="module")
def crashed_run(results_dir):
    return run_harness(results_dir / "e2e-crash", "strategy=custom", "strategy.name=crash",
                       "strategy.module=tests.crashing_strategy", "strategy.connector=CrashOnSecondReceive",
                       "workload=smoke", "sampling.max_tokens=4", "run.request_timeout_s=60")


def test_engine_death_stops_the_run_and_keeps_records(crashed_run):
    assert crashed_run.code == 3
    assert "decode engine" in crashed_run.stderr and "died" in crashed_run.stderr
    assert crashed_run.summary["status"] == "engine_failed"
    assert len(crashed_run.jsonl("baseline.jsonl")) == 4
    assert len(crashed_run.jsonl("requests.jsonl")) == 1  # the request before the crash
    for pid in crashed_run.summary["engine_pids"].values():
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    t = crashed_run.summary["timings"]
    assert t["shutdown_s"] < 30
