"""The record schema: the transfer records cross the process boundary and are joined into
request rows; results/README.md documents exactly the fields that exist."""

import json
import re
from pathlib import Path

from harness.offline.rows import disagg_row
from harness.records.critical_path import TIMELINE
from harness.records.fields import OFFLINE, SERVE
from harness.records.join import path_parts, ttft_overhead_parts
from harness.records.schema import (
    HANDOVER_PATH,
    OVERHEAD_PARTS,
    SCHEMA_VERSION,
    BaselineRow,
    RequestRow,
    ServeRow,
    field_names,
    markdown_table,
    summarized,
)
from harness.records.summary import run_summary, summarize
from harness.records.transfer_records import TransferRecordReader, TransferStats
from harness.settings import settle
from harness.workload import Prompt
from tests.conftest import compose_config
from tests.helpers.serving import serve_rows, serve_summary_of
from transfer_strategies.records import RECORD_VERSION, ComputeRecord, TransferRecord, TransferRecordWriter

README = Path(__file__).resolve().parent.parent / "results" / "README.md"


def documented(heading: str) -> set[str]:
    """The names in the first column of the table under the README heading that starts so."""
    text = README.read_text()
    section = text[text.index(f"\n## {heading}"):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    names = set()
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith(("| column", "| field", "| key", "| ---")):
            names.update(n.strip().strip("`") for n in line.split("|")[1].split(","))
    return names


def expand(names: set[str]) -> set[str]:
    """`<metric>_<stat>[_lo|_hi]` for each metric summed up with that statistic (p50, p90, sum)."""
    return {n.replace("<metric>", f.name) for n in names for f in summarized(OFFLINE)
            if "<metric>" not in n or n.split("<metric>_")[1].split("_")[0] in f.summary[OFFLINE].stats}


def test_readme_tables_of_the_rows_are_what_their_declarations_write():
    """results/README.md's tables of requests.jsonl, baseline.jsonl and runner=serve's rows are
    written from harness/records/fields.py (python scripts/doc_tables.py)."""
    text = README.read_text()
    for kind in (OFFLINE, "baseline", SERVE):
        assert markdown_table(kind) in text, f"python scripts/doc_tables.py ({kind})"
    assert documented("requests.jsonl") == set(field_names(RequestRow))
    assert documented("baseline.jsonl") == set(field_names(BaselineRow))


def test_readme_documents_every_field_of_every_record_and_no_other():
    assert documented("prefill-transfers.jsonl") == set(field_names(TransferRecord))
    assert documented("prefill-transfers.compute.jsonl") == set(field_names(ComputeRecord))


def test_readme_documents_every_summary_key_and_no_other():
    rows = [_request_row(match=True), _request_row(match=False), _request_row(fault="drop", error="no KV"),
            _request_row(aborted="decode", match=False)]
    summary = run_summary(rows, status="mismatch", error=None, run_id="r", strategy="fused", model="m",
                          workload="w", device="cpu", copy_ceiling_gbps=5.0, timings={}, engine_pids={},
                          cudagraph_modes={}, decode_submit="early", kv_blocks_in_use={"prefill": 0, "decode": 0},
                          baseline_self_mismatches=0, baseline_self_match_rate=1.0, control_mismatches=None,
                          control_match_rate=None,
                          transfer_held={"prefill": {"staging_regions": 0}, "decode": {"transfers": 0, "parked": 0}},
                          engines_reused={"baseline": True, "prefill": False, "decode": False},
                          engine_logs={"baseline": "runs/1/baseline.log"}, kv_cache_dtype=None,
                          kv_geometry=None)
    assert summary["schema_version"] == SCHEMA_VERSION and summary["mismatches"] == 3
    assert expand(documented("summary.json")) == set(summary) | {"recomputed", "diagnosis", "link_ceiling_gbps", "link"}


def test_a_serving_mismatch_at_a_near_tie_does_not_fail_the_run():
    """As offline: a P/D output that differs at a near tie is counted (near_ties) and judged
    beside the baseline's own noise without it; one that differs otherwise fails the run."""
    rows = serve_rows()
    rows[0].update(match=False, first_divergence=0, near_tie=True)
    s = serve_summary_of(rows)
    assert s["status"] == "ok" and s["mismatches"] == 1 and s["near_ties"] == 1 and s["match_rate"] == 2 / 3
    rows[1].update(match=False, first_divergence=3, near_tie=False)
    s = serve_summary_of(rows)
    assert s["status"] == "mismatch" and s["exit_code"] == 1
    assert s["error"].startswith("1 output(s) differ from the baseline's (besides 1 at a near tie)")
    rows[6].update(match=False)  # the baseline's second pass differs from its first once: the noise
    assert serve_summary_of(rows)["status"] == "ok"


def test_readme_documents_every_serving_field_and_summary_key_and_no_other():
    assert documented("runner=serve: requests.jsonl") == set(field_names(ServeRow))
    summary = serve_summary_of(serve_rows())
    names = set()
    for n in documented("runner=serve: summary.json"):
        marks = [f.name for f in summarized(SERVE) if f.summary[SERVE].only_measured]
        latencies = [f.name for f in summarized(SERVE) if f.name not in marks and "p50" in f.summary[SERVE].stats]
        counts = [f.name for f in summarized(SERVE) if "sum" in f.summary[SERVE].stats]
        subs = latencies if "<latency>" in n else marks if "<mark>" in n else counts if "<count>" in n else ("",)
        for m in subs:
            n2 = n.replace("<latency>", m).replace("<mark>", m).replace("<count>", m)
            names.update({n2.replace("[base_]", ""), n2.replace("[base_]", "base_")})
    # the baseline goes through no P/D router: no marks there
    assert set(summary) == {n for n in names if not n.startswith(("base_prefill_ttft", "base_decode_ttft"))}


def _request_row(**kw) -> dict:
    row = dict.fromkeys(field_names(RequestRow))
    row.update({"schema_version": SCHEMA_VERSION, "ttft_ms": 10.0, "transfer_ms": 1.0, "bytes": 1000,
                "ttft_overhead_ms": 3.0, **dict.fromkeys(OVERHEAD_PARTS, 0.5), "kv_recomputed": False,
                "decode_preemptions": 0, "prefill_preemptions": 0, **kw})
    return row


def test_the_overhead_parts_add_up_to_the_overhead_and_none_is_negative():
    # hand-off order: the decode step starts its load before the KV is in, the doorbell is seen
    # before the sender's flush returned
    t = dict.fromkeys((f"t_{e}_ms" for e in TIMELINE), None)
    t.update(t_forward_done_ms=8.0, t_sent_ms=8.4, t_kv_arrived_ms=8.3, t_load_start_ms=7.9, t_kv_ready_ms=9.0,
             t_kv_checked_ms=10.0, t_first_token_ms=14.0)
    parts = ttft_overhead_parts(t, base_ttft_ms=9.0)
    assert abs(sum(parts.values()) - (14.0 - 9.0)) < 1e-9
    assert parts["overhead_prefill_ms"] == -1.0 and parts["overhead_delivery_ms"] == 0.0
    assert parts["overhead_pickup_ms"] == 0.0 and abs(parts["overhead_scatter_ms"] - 0.6) < 1e-9
    assert parts["overhead_check_ms"] == 1.0 and parts["overhead_decode_ms"] == 4.0
    assert all(v >= 0 for k, v in parts.items() if k != "overhead_prefill_ms")
    t["t_kv_ready_ms"] = None  # no record (vLLM's own connectors): no parts
    assert set(ttft_overhead_parts(t, 9.0).values()) == {None}


def test_the_overhead_parts_add_up_when_the_forward_pass_is_stamped_done_after_the_first_token():
    """layerwise on a loaded machine: its KV left during the forward pass, whose end was stamped
    after the decode engine had answered (seen in a fresh-clone run: every part but prefill 0,
    their sum 20-25 ms above the overhead). The overlap is credited to the prefill part."""
    t = dict.fromkeys((f"t_{e}_ms" for e in TIMELINE), None)
    t.update(t_forward_done_ms=148.0, t_sent_ms=148.5, t_kv_arrived_ms=110.0, t_load_start_ms=111.0,
             t_kv_ready_ms=112.0, t_kv_checked_ms=113.0, t_first_token_ms=125.0)
    parts = ttft_overhead_parts(t, base_ttft_ms=5.0)
    assert abs(sum(parts.values()) - (125.0 - 5.0)) < 1e-9 and parts["overhead_prefill_ms"] == 120.0
    assert all(v == 0 for k, v in parts.items() if k != "overhead_prefill_ms")
    for shift in (-30.0, 0.0, 30.0):  # any order of events: the parts add up, none but prefill negative
        parts = ttft_overhead_parts({**t, "t_kv_checked_ms": 113.0 + shift, "t_sent_ms": 100 - shift}, 5.0)
        assert abs(sum(parts.values()) - 120.0) < 1e-9
        assert all(v >= 0 for k, v in parts.items() if k != "overhead_prefill_ms")


def test_the_summary_gives_the_parts_means_which_add_up_to_the_mean_overhead():
    n = len(OVERHEAD_PARTS)  # each 0.5 ms in _request_row
    rows = [_request_row(ttft_overhead_ms=0.5 * n), _request_row(ttft_overhead_ms=0.5 * n + 2, overhead_decode_ms=2.5)]
    s = summarize(rows)
    mean = 0.5 * n + 1
    assert s["overhead_mean_ms"] == mean and abs(sum(s["overhead_parts_mean_ms"].values()) - mean) < 1e-9


def _record(side: str, tid: str = "t-0", **kw) -> TransferRecord:
    return TransferRecord(transfer_id=tid, side=side, strategy="FusedConnector", blocks=2, skip_blocks=0, tokens=63,
                          kv_cache_blocks=100, kv_cache_bytes=10**6, bytes=2000, messages=1, **kw)


def test_records_are_read_from_where_the_last_read_stopped(tmp_path):
    path = tmp_path / "prefill-transfers.jsonl"
    writer, reader = TransferRecordWriter(path), TransferRecordReader(path)
    assert reader.read_new() == []  # the worker has not written yet
    writer.write(_record("send", "a", send_ms=1.0))
    writer.write(_record("send", "b", digests=["00ff"]))
    assert [r.transfer_id for r in reader.read_new()] == ["a", "b"]
    assert reader.read_new() == []
    with open(path, "a") as f:  # a line the worker is still writing
        f.write(json.dumps(_record("send", "c").to_dict())[:20])
    assert reader.read_new() == []
    with open(path, "a") as f:
        f.write(json.dumps(_record("send", "c").to_dict())[20:] + "\n")
    (c,) = reader.read_new()
    assert c == _record("send", "c") and c.schema_version == RECORD_VERSION


def test_an_unversioned_record_loads_as_version_1():
    old = {k: v for k, v in _record("receive", transfer_ms=2.0).to_dict().items()
           if k not in ("schema_version", "gpu_ms", "digests")}
    rec = TransferRecord.from_dict({**old, "field_of_the_future": 1})
    assert rec.schema_version == 1 and rec.transfer_ms == 2.0 and rec.digests is None


def test_disagg_row_joins_both_sides_records(tmp_path):
    sends, receives = tmp_path / "prefill-transfers.jsonl", tmp_path / "decode-transfers.jsonl"
    stats = TransferStats(sends, receives)
    TransferRecordWriter(sends).write(_record("send", "t-0", send_ms=0.5, digests={"all": ["aa", "bb"]}))
    TransferRecordWriter(receives).write(_record("receive", "t-0", transfer_ms=0.25, notify_ms=0.1, load_ms=0.3,
                                                 ready_ms=0.4, digests={"all": ["aa", "bc"]}))
    cfg = compose_config("strategy=fused")
    base = BaselineRow(run_id="r", prompt_idx=0, prompt_len=64, ttft_ms=5.0, e2e_ms=9.0, token_ids=[1, 2, 3],
                       logprobs=[-0.1, -0.2, -0.3])
    results = [{"token_ids": [1], "first_token_t": 100.004, "finished_t": 100.004, "submitted_t": 100.0},
               {"token_ids": [1, 2, 4], "logprobs": [-0.1, -0.2, -0.5], "first_token_t": 100.010,
                "finished_t": 100.020, "submitted_t": 100.0}]
    row = disagg_row(settle(cfg, "cpu"), "r", Prompt(0, list(range(64))), 100.0, results, base, stats, "t-0")
    assert list(row) == field_names(RequestRow) and row["schema_version"] == SCHEMA_VERSION
    assert row["digest_match"] is False and row["match"] is False and row["first_divergence"] == 2
    assert row["transfer_ms"] == row["transfer_host_ms"] == 0.25 and row["gpu_ms"] is None
    assert row["gbps"] == 2000 / 0.25 / 1e6 and row["send_ms"] == 0.5 and row["notify_ms"] == 0.1
    assert abs(row["ttft_overhead_ms"] - 5.0) < 1e-6
    # a strategy without records (vLLM's own connectors): the row has no transfer columns
    row = disagg_row(settle(cfg, "cpu"), "r", Prompt(1, [5]), 100.0, results, base, stats, "t-1")
    assert row["bytes"] is None and row["transfer_ms"] is None and row["digest_match"] is None


def test_on_a_gpu_transfer_ms_is_the_gpu_clock(tmp_path):
    sends, receives = tmp_path / "s.jsonl", tmp_path / "r.jsonl"
    TransferRecordWriter(sends).write(_record("send", gpu_ms=0.2))
    TransferRecordWriter(receives).write(_record("receive", transfer_ms=0.3))
    cfg = compose_config("strategy=fused")
    base = {"token_ids": [1], "logprobs": None, "ttft_ms": 1.0, "e2e_ms": 1.0}
    results = [{"token_ids": [1], "first_token_t": 1.0, "finished_t": 1.0, "submitted_t": 0.0},
               {"token_ids": [1], "logprobs": None, "first_token_t": 1.0, "finished_t": 1.0, "submitted_t": 0.0}]
    row = disagg_row(settle(cfg, "cuda"), "r", Prompt(0, [1]), 0.0, results, base, TransferStats(sends, receives),
                     "t-0")
    assert (row["transfer_ms"], row["transfer_host_ms"], row["gpu_ms"]) == (0.2, 0.3, 0.2)


def test_schema_version_is_in_the_readme_table_of_versions():
    assert re.search(rf"^\| {SCHEMA_VERSION} \|", README.read_text(), re.M)


def test_recomputes_are_counted_and_those_after_a_preemption_told_apart():
    rows = [_request_row(kv_recomputed=True, decode_preemptions=2), _request_row(kv_recomputed=True),
            _request_row(), _request_row(kv_recomputed=None)]  # None: no compute record (vLLM's connector)
    s = summarize(rows)
    assert (s["kv_recomputed"], s["kv_recomputed_preempted"], s["decode_preemptions"]) == (2, 1, 2)
    assert "kv_recomputed" not in summarize([_request_row(kv_recomputed=None)])


def test_faults_count_as_caught_when_the_request_failed_or_was_recomputed_right():
    rows = [_request_row(fault="drop", error="no KV arrived"),
            _request_row(fault="flip", kv_recomputed=True, match=True),
            _request_row(fault="flip", match=False), _request_row(match=True)]
    s = summarize(rows)
    assert (s["faults_injected"], s["faults_caught"], s["faults_missed"]) == (3, 2, 1)
    assert "faults_injected" not in summarize([_request_row(match=True)])


def test_records_that_come_late_are_waited_for_when_the_kv_was_sent(tmp_path):
    """A worker writes its record off the engine's step: under TP on the 2-core machine a decode
    worker's came more than 1 s after its request ended, a prefill worker's 3.4 s after, and the
    transfer went unjudged. Once the decode request took its KV, both must come: they are waited
    for; an aborted request's receive record (none may come) is not waited for past 1 s."""
    import threading
    import time

    sends, receives = tmp_path / "prefill-transfers.jsonl", tmp_path / "decode-transfers.jsonl"
    stats = TransferStats(sends, receives, expected=True)
    for tid in ("late", "aborted"):
        TransferRecordWriter(sends).write(_record("send", tid, digests={"all": ["aa"]}))
    later = threading.Timer(2.0, lambda: TransferRecordWriter(receives).write(
        _record("receive", "late", digests={"all": ["aa"]})))
    later.start()
    t0 = time.monotonic()
    send, recv, agree = stats.take_transfer("late")
    assert recv is not None and agree is True and 1.9 < time.monotonic() - t0 < 10

    def both():
        TransferRecordWriter(sends).write(_record("send", "late_send", digests={"all": ["bb"]}))
        TransferRecordWriter(receives).write(_record("receive", "late_send", digests={"all": ["bb"]}))
    threading.Timer(1.5, both).start()
    send, recv, agree = stats.take_transfer("late_send")
    assert send is not None and recv is not None and agree is True
    t0 = time.monotonic()
    assert stats.take_transfer("aborted", received=False)[1] is None and time.monotonic() - t0 < 2


def test_a_serving_requests_handover_parts_add_up_to_its_time_to_the_decodes_first_token():
    """runner=serve: the router's stamp and the prefill engine's admission come before the forward
    pass; the rows' parts add up to the decode's first token, the summary's means to their mean,
    and that less the baseline's TTFT is the overhead."""
    t = {"t_routed_ms": 1.5, "t_prefill_admitted_ms": 40.0, "t_forward_done_ms": 90.0, "t_sent_ms": 91.0,
         "t_kv_arrived_ms": 91.2, "t_load_start_ms": 95.0, "t_kv_ready_ms": 96.0, "t_kv_checked_ms": 96.5,
         "t_first_token_ms": 110.0}
    parts = path_parts(t, HANDOVER_PATH)
    assert list(parts) == [p for p, _ in HANDOVER_PATH] and abs(sum(parts.values()) - 110.0) < 1e-9
    assert parts["router"] == 1.5 and parts["prefill_queue"] == 38.5 and parts["prefill"] == 50.0
    assert path_parts({**t, "t_routed_ms": None}, HANDOVER_PATH) is None
    rows = serve_rows()
    for i, r in enumerate(r for r in rows if r["path"] == "disagg"):
        r.update(base_ttft_ms=80.0 + i, **{f"handover_{p}_ms": v * (i + 1) for p, v in parts.items()})
    s = serve_summary_of(rows)
    assert s["handover_requests"] == 3 and abs(s["handover_ttft_mean_ms"] - 220.0) < 1e-9  # 110 x mean(1, 2, 3)
    assert abs(sum(s["handover_parts_mean_ms"].values()) - s["handover_ttft_mean_ms"]) < 1e-9
    assert s["handover_base_ttft_mean_ms"] == 81.0 and abs(s["handover_overhead_mean_ms"] - 139.0) < 1e-9


def test_two_threads_sharing_the_records_reader_take_every_record_once(tmp_path):
    """runner=serve's row writers of the load and of the probes share one TransferStats while the
    workers append: without its lock, two reads from one offset advanced it twice and the next read
    began inside a record (a JSON error that ended a row writer and lost its rows)."""
    import threading

    sends, receives = tmp_path / "prefill-transfers.jsonl", tmp_path / "decode-transfers.jsonl"
    stats = TransferStats(sends, receives)
    n, taken, errors = 300, {"a": [], "b": []}, []
    writers = TransferRecordWriter(sends), TransferRecordWriter(receives)

    def write():
        for i in range(n):
            for w, side in zip(writers, ("send", "receive")):
                w.write(_record(side, f"t-{i}"))

    def take(name: str, ids: list[int]):
        try:
            for i in ids:
                while not stats.has_both(f"t-{i}"):
                    pass
                send, recv, _ = stats.take_transfer(f"t-{i}")
                taken[name].append((send.transfer_id, recv.transfer_id))
        except Exception as e:  # noqa: BLE001 - what the thread met, for the assert
            errors.append(e)

    threads = [threading.Thread(target=write), threading.Thread(target=take, args=("a", range(0, n, 2))),
               threading.Thread(target=take, args=("b", range(1, n, 2)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert sorted(taken["a"] + taken["b"]) == sorted((f"t-{i}", f"t-{i}") for i in range(n))
