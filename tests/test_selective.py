"""serve.pd_policy=selective (harness/serving/selective.py): which requests the router sends to the
decode instance alone, from the prompt's length and what the decode instance is estimated to hold;
and a P/D request that moved no KV unannounced failing the run (kv_not_moved). The router against
real instances: tests/test_serve_deployment.py; runner=serve with it: tests/test_serve_cpu.py."""

from __future__ import annotations

import asyncio
import runpy

import pytest

from harness.records.files import read_jsonl
from harness.records.schema import DECODE_ONLY, DISAGG
from harness.records.transfer_records import TransferStats
from harness.serving.load import ClientResult
from harness.serving.rows import row
from harness.serving.selective import PrefixTable, Selective
from harness.settings import settle
from harness.workload import Prompt
from tests.conftest import FULL, ROOT, run_harness
from tests.helpers.serving import config, serve_rows, serve_summary_of

TRACE = ROOT / "tests" / "data" / "trace.jsonl"
selective_report = runpy.run_path(str(ROOT / "scripts" / "selective_report.py"))["main"]


def test_a_prefix_is_held_block_by_block_and_only_after_the_blocks_before_it():
    t = PrefixTable(block_size=4, capacity_blocks=None)
    a = list(range(10))  # two full blocks and two tokens
    assert t.cached_tokens(a) == 0
    t.add(a)
    assert t.cached_tokens(a) == 8 and t.cached_tokens(a[:7]) == 4 and t.cached_tokens(a + [99] * 6) == 8
    assert t.cached_tokens([99] + a[1:]) == 0  # the same second block after another first one: not a hit
    assert len(t.blocks) == 2  # the partial block is not cached (vLLM caches whole blocks)


def test_the_least_recently_used_blocks_go_first_and_a_cache_off_holds_nothing():
    t = PrefixTable(block_size=2, capacity_blocks=3)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    t.add(a)
    t.add(b)  # 4 blocks for 3 places: a's first block goes
    assert t.cached_tokens(a) == 0 and t.cached_tokens(b) == 4
    off = PrefixTable(block_size=2, capacity_blocks=0)  # enable_prefix_caching=False
    off.add(a)
    assert off.cached_tokens(a) == 0


def test_short_or_mostly_held_prompts_go_to_the_decode_instance_alone():
    s = Selective(min_prompt_tokens=16, min_uncached_tokens=8)
    s.tables["d"] = PrefixTable(block_size=4, capacity_blocks=None)  # as read from the instance's /metrics

    def route(ids):
        return asyncio.run(s.route(None, "d", {"prompt": ids}))
    long = list(range(40))
    assert route(list(range(100, 110))) == DECODE_ONLY  # 10 tokens < 16
    assert route(long) == DISAGG  # 40 tokens, none held
    assert route(long) == DECODE_ONLY  # all 40 held now: 0 uncached < 8
    assert route(long + list(range(200, 210))) == DISAGG  # 10 new tokens beyond the 40 held
    assert route(long[:36] + list(range(300, 307))) == DECODE_ONLY  # 36 held, 7 new
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="min_prompt_tokens must be an integer >= 0"):
            Selective(bad, 0)


def unannounced_row(tmp_path, route: str | None) -> dict:
    """A P/D request as rows.py writes it when the decode instance answered it but no connector
    recorded a transfer (a router that sent it to the decode instance alone): what the verdict
    sees, with the records as runner=serve reads them (TransferStats, records expected)."""
    cfg = config("runner=serve", "strategy=fused")
    stats = TransferStats(tmp_path / "prefill-transfers.jsonl", tmp_path / "decode-transfers.jsonl", expected=True)
    stats.patience_s = 0.2  # the first missing record is waited for this long (RECEIVE_WAIT_S in a run)
    r = ClientResult(0, 0, 40, 0.0, 0.0, t_first=0.01, t_done=0.02, token_times=[0.01, 0.02], token_ids=[5, 6],
                     logprobs=[-0.1, -0.2], transfer_id="t0", route=route)
    out = row(settle(cfg, "cpu"), "run", "disagg", r, Prompt(0, list(range(40))), r, stats, 1.0)
    # a send record that never came lowers the wait for the next (the run fails as kv_not_moved)
    assert stats.patience_s == (1.0 if route == DISAGG else 0.2)
    return out


def test_a_request_disaggregated_with_no_transfer_on_either_side_fails_the_run(tmp_path):
    """kv_not_moved: the router said disagg, yet neither engine's connector has a record of it;
    its output matches the baseline's, so only the records can tell. A decode-only request (the
    router said so) is judged on its output alone."""
    rows = serve_rows()
    for r in rows:
        if r["path"] == "disagg":
            r.update(route=DISAGG, sent_tokens=39, decode_computed_tokens=1)
    quiet = unannounced_row(tmp_path, DISAGG)
    assert quiet["sent_tokens"] is None and quiet["decode_computed_tokens"] is None and quiet["match"]
    rows[0].update({k: quiet[k] for k in ("route", "sent_tokens", "decode_computed_tokens", "digest_match", "bytes")})
    s = serve_summary_of(rows, records_expected=True)
    assert s["status"] == "kv_not_moved" and s["kv_not_moved"] == 1 and s["exit_code"] == 1
    assert s["error"].startswith("1 request(s) the router disaggregated left no transfer record on either side")
    assert serve_summary_of(rows)["kv_not_moved"] is None  # no connector records to expect (vLLM's own)
    announced = unannounced_row(tmp_path, DECODE_ONLY)
    assert announced["route"] == DECODE_ONLY and announced["digest_match"] is None
    rows[0].update(route=DECODE_ONLY)
    s = serve_summary_of(rows, records_expected=True)
    assert s["status"] == "ok" and s["kv_not_moved"] == 0 and s["decode_only_requests"] == 1


@pytest.mark.engine
@FULL
def test_the_serving_runner_judges_decode_only_requests_on_their_outputs(results_dir):
    """runner=serve with serve.pd_policy=selective over tests/data/trace.jsonl (block 32): the
    60- and 100-token prompts are disaggregated (the second's first block alone was sent to the
    decode instance before); the 40-token one is under min_prompt_tokens, and the 70-token one has
    its first two blocks in the decode instance from the 100-token one: both go to it alone. Every
    output matches the baseline's; only the disaggregated ones have transfers and digests."""
    run = run_harness(results_dir / "serve-selective", "runner=serve", "strategy=fused", "workload=trace",
                      f"workload.path={TRACE}", "workload.block_tokens=32", "serve.baseline_repeat=false",
                      "serve.pd_policy=selective", "serve.selective.min_prompt_tokens=50",
                      "serve.selective.min_uncached_tokens=40")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["decode_only_requests"] == 2 and s["kv_not_moved"] == 0
    rows = sorted(run.jsonl("requests.jsonl"), key=lambda r: r["request_idx"])
    assert [r["route"] for r in rows] == [DISAGG, DISAGG, DECODE_ONLY, DECODE_ONLY]
    assert all(r["digest_match"] and r["sent_tokens"] == r["prompt_len"] - 1 for r in rows[:2])
    assert all(r["digest_match"] is None and r["sent_tokens"] is None and r["bytes"] is None for r in rows[2:])
    assert s["digest_checked"] == 2 and "2 of 4 P/D-path requests to the decode instance alone" in run.stdout
    assert all(r["route"] is None for r in run.jsonl("baseline.jsonl"))
    # vLLM counts the decode-only prompts as computed there (or found in its cache), none as received
    v = s["vllm_prompt_tokens_by_source"]
    assert s["vllm_received_tokens_agree"] is True and v["local_compute"] + v["local_cache_hit"] >= 40 + 70 - 2


SWEEP = ROOT / "results" / "cpu" / "2026-12-07-s43-selective"


def test_the_committed_sweeps_report_is_what_the_report_script_writes(tmp_path):
    """docs/serving.md's tables: scripts/selective_report.py over the committed sweep writes them
    again, and scripts/make_trace.py writes the trace it ran on again (the same seed, the same
    requests)."""
    out = tmp_path / "report"
    assert selective_report(["--out", str(out), str(SWEEP)]) == 0
    assert (out / "report.md").read_text() == (SWEEP / "report.md").read_text()
    assert (out / "report.md").read_text() in (ROOT / "docs" / "serving.md").read_text()
    make_trace = runpy.run_path(str(ROOT / "scripts" / "make_trace.py"))["make_trace"]
    trace = make_trace(40, 1.5, 16, 1536, 32, seed=0)
    assert read_jsonl(SWEEP / "trace.jsonl") == trace  # kept gzipped
    assert selective_report([str(tmp_path)]) == 2  # nothing there: one line, exit 2
