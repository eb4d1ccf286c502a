"""Every committed result (results/cpu, results/gpu) is a run directory the loader reads, and
what it loads agrees with what was committed beside it: the benchmark's rows.csv medians come
back from the runs' requests, and the reconstructed configs match what the rows measured."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from harness.records.files import read_jsonl
from harness.records.schema import SCHEMA_VERSION
from harness.report import benchmark as bench
from harness.report.load import find_runs, load_requests, load_runs

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = [ROOT / "results" / "cpu", ROOT / "results" / "gpu"]
KEY_COLUMNS = ["strategy", "prompt_len", "match", "digest_match", "ttft_ms", "base_ttft_ms", "transfer_ms", "bytes",
               "messages", "gbps", "schema_version", "strategy.name", "engine.kv_cache_gib", "engine.max_model_len",
               "model.name", "device.type", "vllm", "git_sha"]



def run_dirs() -> list[Path]:
    return find_runs(*COMMITTED)


def bench_dirs() -> list[Path]:
    return sorted(p.parent for d in COMMITTED for p in d.rglob("rows.csv") if find_runs(p.parent))


def corrupted(df: pd.DataFrame) -> pd.Series:
    """Rows of a negative control (check.corrupt): they pass by failing."""
    return df.get("check.corrupt", pd.Series(False, index=df.index)).fillna(False).astype(bool)


def with_vllms_cpu_rotary_op(df: pd.DataFrame) -> pd.Series:
    """Runs that give vLLM's CPU rotary op back to an MLA model (2026-12-07-s41-mla/fused-cpu-rotary-op):
    the upstream fault they show passes by failing, the KV intact."""
    ops = df.get("engine.extra.compilation_config.custom_ops", pd.Series(None, index=df.index))
    return ops.apply(lambda v: isinstance(v, tuple) and "all" in v)


def test_every_committed_run_directory_loads():
    runs = load_runs(*COMMITTED)
    assert len(runs) == len(run_dirs()) >= 30
    # every committed run passed; a negative control's passes by failing (2026-12-03-s16/sweep-corrupt)
    corrupt = corrupted(runs) | with_vllms_cpu_rotary_op(runs)
    assert set(runs["status"][~corrupt]) == {"ok"} and set(runs["status"][corrupt]) <= {"mismatch"}
    assert (runs["strategy"] == runs["strategy.name"]).all()
    assert runs["git_sha"].str.fullmatch("[0-9a-f]{40}(-dirty)?").all()
    # only results written before the records were versioned have a meta.json written afterwards
    # (version-1 runs of the old code made later, for an A/B, have their own)
    assert (runs["schema_version"] == 1)[runs["reconstructed"]].all()
    assert not runs["reconstructed"][runs["schema_version"] > 1].any()
    assert set(runs["schema_version"]) <= set(range(1, SCHEMA_VERSION + 1))
    # the check runs kept only their summaries; every benchmark run kept its requests
    with_requests = {str(d) for d in run_dirs() if read_jsonl(d / "requests.jsonl")}
    assert {str(d) for d in run_dirs() if "/check-" not in str(d)} == with_requests


@pytest.mark.parametrize("run", run_dirs(), ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_requests_load_with_their_key_columns(run):
    lines = read_jsonl(run / "requests.jsonl")  # or requests.jsonl.gz
    df = load_requests(run)
    if read_jsonl(run / "baseline.jsonl") and "path" in df:  # runner=serve: both paths' rows
        return check_serve_rows(run, df, lines)
    assert len(df) == len(lines)
    if not lines:
        return
    assert set(KEY_COLUMNS) <= set(df.columns)
    if df.get("scenario.name", pd.Series("none", index=df.index)).fillna("none").ne("none").any():
        return check_scenario_rows(run, df)
    if corrupted(df).all():
        assert not df["digest_match"].any()  # the negative control: every transfer's damage caught
        return
    if with_vllms_cpu_rotary_op(df).all():  # outputs wrong, every block right: the fault is in the engine
        assert df["digest_match"].all() and not df["match"].all()
        return
    assert not df[["strategy", "prompt_len", "ttft_ms", "strategy.name"]].isna().any().any()
    # vLLM's own connectors' bytes and transfer times are not seen from outside (the observer)
    # (vllm_nixl, vllm_mooncake), and vllm_example runs with no observer: no records, digests off
    ours = df["strategy.module"].notna() if "strategy.module" in df else pd.Series(True, index=df.index)
    assert not df.loc[ours, ["transfer_ms", "bytes", "kv_cache_bytes"]].isna().any().any()
    observed = ours | (df.get("strategy.observed", pd.Series(False, index=df.index)) == True)  # noqa: E712
    assert df.loc[~observed, "digest_match"].isna().all() and df.loc[~observed, "kv_cache_bytes"].isna().all()
    # committed runs passed: every output equal to the baseline's, or at a near tie (bf16, from version 6),
    # unless the KV moved compressed (a lossy strategy's codec) or stored so (kv_cache_dtype: from version 12)
    lossy = df.get("codec", pd.Series(None, index=df.index)).notna().any() or load_runs(run).get(
        "kv_cache_dtype", pd.Series([None])).notna().any()
    if not lossy:
        assert (df["match"] | (df["near_tie"] == True if "near_tie" in df else False)).all()  # noqa: E712 - NaN is not True
    assert df.loc[observed, "digest_match"].all()
    assert (df["schema_version"] == load_runs(run)["schema_version"][0]).all()
    assert (df["strategy"] == df["strategy.name"]).all()
    # the reconstructed config is the one these requests ran under
    assert (df["prompt_len"] + df["output_len"] <= df["engine.max_model_len"]).all()
    # kv_cache_gib is per worker (vLLM's kv_cache_memory_bytes); a record's cache, the engine's: every worker's
    workers = df.get("engines.prefill.tensor_parallel_size", pd.Series(1, index=df.index)).fillna(1)
    cache = (df["engine.kv_cache_gib"] * 2**30 * workers)[observed]
    assert ((df["kv_cache_bytes"][observed] - cache).abs() <= 0.01 * cache).all()
    assert (df["device.type"].isin([df["device"][0], "auto"])).all()


def check_scenario_rows(run: Path, df: pd.DataFrame) -> None:
    """A scenario (conf/scenario) bends a run on purpose: faults fail or recompute requests,
    aborts abort them, pressure shrinks a KV pool below engine.kv_cache_gib. Committed, it passed
    as its scenario demands: every fault caught, every request that was neither aborted nor
    failed on purpose matching the baseline."""
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and not summary.get("faults_missed")
    plain = df[df["aborted"].isna() & df["fault"].isna() & df["error"].isna()]
    assert (plain["match"] | plain["near_tie"].eq(True)).all() and plain["digest_match"].all()
    assert (df["strategy"] == df["strategy.name"]).all()


def check_serve_rows(run: Path, df: pd.DataFrame, lines: list[str]) -> None:
    base_lines = read_jsonl(run / "baseline.jsonl")
    assert len(df) == len(lines) + len(base_lines) and set(df["path"]) <= {"disagg", "baseline", "baseline_repeat"}
    ok = df[df["status"] == "ok"]
    assert not ok[["strategy", "prompt_len", "ttft_ms", "e2e_ms", "tpot_ms", "strategy.name", "request_rate"]]\
        .isna().any().any()
    disagg = ok[ok["path"] == "disagg"]
    # every output equal to the baseline's, or (from version 7) at a near tie, or within the
    # baseline's own differences under the same load
    differ = (~disagg["match"].astype(bool) & disagg.get("near_tie", pd.Series(None, index=disagg.index)).ne(True))
    noise = (~ok[ok["path"] == "baseline_repeat"]["match"].astype(bool)).sum()
    assert differ.sum() <= noise
    if json.loads((run / "summary.json").read_text()).get("external_endpoints"):  # a deployment it did not start:
        assert disagg["digest_match"].isna().all()  # no transfer records to join
    else:  # every request whose KV moved checked; one sent to the decode instance alone (version 20) moved none
        alone = disagg["route"].eq("decode_only") if "route" in disagg else pd.Series(False, index=disagg.index)
        assert disagg[~alone]["digest_match"].all() and (disagg[~alone]["bytes"] > 0).all()
        assert disagg[alone]["digest_match"].isna().all() and disagg[alone]["bytes"].isna().all()
    assert (df["schema_version"] == load_runs(run)["schema_version"][0]).all()
    assert (df["strategy"] == df["strategy.name"]).all() and (df["runner.name"] == "serve").all()
    assert (df["prompt_len"] + df["output_len"] <= df["engine.max_model_len"]).all()
    # one schedule for every path
    assert (df.groupby("request_idx")["arrival_s"].nunique() == 1).all()


@pytest.mark.parametrize("out", bench_dirs(), ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_benchmark_table_medians_come_back_from_its_runs(out):
    committed = pd.read_csv(out / "rows.csv")
    strategies = [s for s in dict.fromkeys(committed["strategy"]) if (out / s).is_dir()]
    rows = pd.DataFrame(bench.strategy_rows(load_requests(out), strategies, ceiling=1.0))
    committed = committed[committed["strategy"].isin(strategies)]
    assert len(rows) == len(committed)
    merged = committed.merge(rows, on=["strategy", "prompt_len"], suffixes=("", "_loaded"))
    compared = [c for c in bench.medians() if c in committed.columns]
    assert len(merged) == len(committed) and {"transfer_ms", "bytes", "gbps"} <= set(compared)
    for c in compared:
        for want, got in zip(merged[c], merged[f"{c}_loaded"], strict=True):
            want, got = (math.nan if v is None else v for v in (want, got))  # None, NaN: not measured
            assert math.isclose(want, got, rel_tol=1e-9) or (math.isnan(want) and math.isnan(got)), (c, want, got)


def test_a_benchmark_of_connectors_whose_bytes_are_not_seen_draws_its_figure(tmp_path):
    """vLLM's connectors alone: no bandwidth to draw, the TTFT overheads still (the figure of this
    run once made gpu_run.sh exit 1 after its table was written)."""
    run = ROOT / "results" / "gpu" / "2026-12-07-s39" / "connectors-ucx-cuda-ipc"
    (tmp_path / "rows.csv").write_bytes((run / "rows.csv").read_bytes())
    assert pd.read_csv(tmp_path / "rows.csv")["gbps"].isna().all()
    bench.plot(tmp_path)
    assert (tmp_path / "figure.png").stat().st_size > 0


def test_a_benchmark_without_digests_says_off_not_failed():
    runs = ROOT / "results" / "gpu" / "2026-11-30-s6"
    off = bench.strategy_rows(load_requests(runs / "ttft-nodigests"), ["fused"], ceiling=1.0)
    on = bench.strategy_rows(load_requests(runs / "ttft-early"), ["fused"], ceiling=1.0)
    assert [bench.digests_cell(r) for r in off] == ["off", "off"]
    assert [bench.digests_cell(r) for r in on] == ["ok"] * 3
    assert bench.digests_cell({"digest_ok": False}) == "FAIL"


def test_runs_recorded_before_after_forward_ms_get_it_from_their_timeline():
    run = ROOT / "results" / "gpu" / "2026-11-30-s6" / "ttft-early" / "fused"
    df = load_requests(run)
    assert not any("after_forward_ms" in row for row in read_jsonl(run / "requests.jsonl"))  # or .gz
    assert ((df["after_forward_ms"] - (df["t_first_token_ms"] - df["t_forward_done_ms"])).abs() < 1e-9).all()
    v1 = load_requests(ROOT / "results" / "cpu")
    assert v1["after_forward_ms"].isna().eq(v1["t_forward_done_ms"].isna()).all()


def test_retable_writes_a_benchmarks_tables_again_from_its_runs(tmp_path):
    import shutil
    import subprocess
    import sys

    out = tmp_path / "bench"
    shutil.copytree(ROOT / "results" / "gpu" / "2026-11-30-s6" / "ttft-nodigests", out)
    (out / "table.md").write_text((out / "table.md").read_text().splitlines()[0] + "\n")
    (out / "figure.png").unlink(missing_ok=True)  # not committed (drawn again from rows.csv), but one may be drawn
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_strategies.py"), "--retable", str(out)],
                   check=True, capture_output=True)
    table = (out / "table.md").read_text()
    main = table.split("\n\n")[1]  # the strategy table (then the note and the first requests against the rest)
    assert "after forward ms" in main and main.count("| fused |") == 2 and "| off |" in main
    assert "first: TTFT overhead ms" in table and table.count("| fused |") == 4
    assert (out / "figure.png").exists()
    committed = pd.read_csv(ROOT / "results" / "gpu" / "2026-11-30-s6" / "ttft-nodigests" / "rows.csv")
    # the same figures; the columns in the declarations' order (harness/records/fields.py)
    pd.testing.assert_frame_equal(pd.read_csv(out / "rows.csv")[committed.columns], committed)
