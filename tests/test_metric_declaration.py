"""The worked example of harness/records/README.md: a per-request metric declared once, in
harness/records/fields.py, is joined into the rows from the connectors' records, summed up in
summary.json, shown in the benchmark's table and rows.csv, judged by the compare gate and
documented in results/README.md's table, with no other list to edit. Fast: no engines."""

import json

import pytest

import harness.report.compare as gate
from harness.offline.rows import disagg_row
from harness.records import fields
from harness.records.fields import OFFLINE, P50_P90, Field
from harness.records.schema import BaselineRow, RequestRow, markdown_table
from harness.records.summary import summarize
from harness.records.transfer_records import TransferStats
from harness.report.benchmark import csv_columns, write_tables
from harness.settings import settle
from harness.workload import Prompt
from tests.conftest import compose_config
from transfer_strategies.records import TransferRecord, TransferRecordWriter

# The decode worker's digests' own time: measured and recorded by the connectors since version 9
# (TransferRecord.digest_ms), never in the request rows until declared.
CHECK_MS = Field("check_ms", "float | None", "the decode worker's digests of the blocks the transfer wrote, their own "
                 "time (its record's digest_ms)", source="receive.digest_ms", label="check ms", unit="ms", spec=".3f",
                 better="lower", summary={OFFLINE: P50_P90}, shown=("bench", "gate"))


@pytest.fixture
def declared():
    fields.FIELDS.append(CHECK_MS)
    try:
        yield CHECK_MS
    finally:
        fields.FIELDS.remove(CHECK_MS)


def record(side: str, tid: str, digest_ms: float) -> TransferRecord:
    return TransferRecord(transfer_id=tid, side=side, strategy="FusedConnector", blocks=2, skip_blocks=0, tokens=63,
                          kv_cache_blocks=100, kv_cache_bytes=10**6, bytes=2000, messages=1, transfer_ms=0.25,
                          digests={"all": ["aa", "bb"]}, digest_ms=digest_ms)


def rows_of(tmp_path, check_ms: list[float]) -> list[dict]:
    """requests.jsonl's rows of a run whose decode worker took check_ms[i] over request i's digests."""
    tmp_path.mkdir(exist_ok=True)
    sends, receives = tmp_path / "prefill-transfers.jsonl", tmp_path / "decode-transfers.jsonl"
    stats = TransferStats(sends, receives)
    settings = settle(compose_config("strategy=fused"), "cpu")
    base = BaselineRow(run_id="r", prompt_idx=0, prompt_len=64, ttft_ms=5.0, e2e_ms=9.0, token_ids=[1, 2],
                       logprobs=None)
    results = [{"token_ids": [1], "first_token_t": 100.004, "finished_t": 100.004, "submitted_t": 100.0},
               {"token_ids": [1, 2], "logprobs": None, "first_token_t": 100.010, "finished_t": 100.020,
                "submitted_t": 100.0}]
    rows = []
    for i, ms in enumerate(check_ms):
        TransferRecordWriter(sends).write(record("send", f"t-{i}", 0.1))
        TransferRecordWriter(receives).write(record("receive", f"t-{i}", ms))
        rows.append(disagg_row(settings, "r", Prompt(i, list(range(64))), 100.0, results, base, stats, f"t-{i}"))
    return rows


def write_run(bench_dir, label: str, rows: list[dict]) -> None:
    run = bench_dir / label
    run.mkdir(parents=True)
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"status": "ok", "decode_submit": "early", **summarize(rows)}))


def test_a_metric_declared_once_is_joined_summed_up_shown_gated_and_documented(declared, tmp_path, capsys):
    rows = rows_of(tmp_path / "records", [1.0, 2.0, 3.0])
    assert [r["check_ms"] for r in rows] == [1.0, 2.0, 3.0] and list(rows[0]) == RequestRow.names()
    s = summarize(rows)
    assert s["check_ms_p50"] == 2.0 and s["check_ms_p90"] == pytest.approx(2.8)
    assert s["check_ms_p50_lo"] <= 2.0 <= s["check_ms_p50_hi"]

    ref, new = tmp_path / "ref", tmp_path / "new"
    write_run(ref, "fused", rows)
    write_run(new, "fused", rows_of(tmp_path / "slower", [11.0, 12.0, 13.0] * 4))
    table = write_tables(ref, ["fused"], ceiling=10.0, title="t")
    assert "| check ms |" in table.splitlines()[2] and "2.000 [1.000, 3.000]" in table
    assert "check_ms" in csv_columns() and "check_ms" in (ref / "rows.csv").read_text().splitlines()[0]

    assert "check_ms" in gate.metrics()
    code = gate.main([str(new), str(ref), "--metrics", "check_ms"])
    assert code == 1 and "SLOWER: fused early 64 check_ms" in capsys.readouterr().out

    assert "| check_ms | ms | p50 [95%], p90 | the decode worker's digests" in markdown_table(OFFLINE)


def test_without_the_declaration_nothing_knows_the_metric(tmp_path):
    rows = rows_of(tmp_path, [1.0])
    assert "check_ms" not in rows[0] and "check_ms_p50" not in summarize(rows)
    assert "check_ms" not in gate.metrics() and "check_ms" not in csv_columns()
