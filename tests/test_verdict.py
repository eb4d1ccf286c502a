"""One set of rules decides a run's status for both runners (harness/records/verdict.py)."""

import pytest

from harness.records.verdict import judge, unmet
from tests.helpers.serving import serve_rows, serve_summary_of

CLEAN = {"transfer_errors": 0, "digest_failures": 0, "digest_checked": 4, "mismatches": 0, "near_ties": 0,
         "kv_recomputed": 0, "kv_recomputed_preempted": 0}


def test_each_failure_has_its_status_and_the_first_that_holds_decides():
    assert judge(CLEAN, noise=0) == ("ok", None)
    cases = [({"transfer_errors": 1}, "transfer_failed"), ({"digest_failures": 1}, "mismatch"),
             ({"mismatches": 2, "near_ties": 1}, "mismatch"), ({"kv_recomputed": 1}, "kv_recomputed")]
    for change, status in cases:
        assert judge({**CLEAN, **change}, noise=0)[0] == status, change
    assert judge(CLEAN, noise=0, faults=(1, 3))[0] == "fault_missed"
    assert judge(CLEAN, noise=0, held={"decode": 2})[0] == "kv_leak"
    assert judge(CLEAN, noise=0, failed_requests=["disagg #3: HTTP 500"])[0] == "requests_failed"
    # earlier rules win: a transfer error explains the digests and outputs it spoilt
    everything = {**CLEAN, "transfer_errors": 1, "digest_failures": 1, "mismatches": 3, "kv_recomputed": 1}
    status, error = judge(everything, noise=0, first_transfer_error="no KV arrived", held={"decode": 1})
    assert status == "transfer_failed" and error == "1 transfer(s) failed: no KV arrived"


def test_noise_near_ties_and_expected_recomputes_are_not_failures():
    assert judge({**CLEAN, "mismatches": 2}, noise=2)[0] == "ok"  # the baseline differs from itself as often
    assert judge({**CLEAN, "mismatches": 3, "near_ties": 1}, noise=2)[0] == "ok"
    assert judge({**CLEAN, "kv_recomputed": 2, "kv_recomputed_preempted": 2}, noise=0)[0] == "ok"
    assert judge({**CLEAN, "kv_recomputed": 1}, noise=0, expect_recompute=True)[0] == "ok"
    status, error = judge({**CLEAN, "mismatches": 1}, noise=0)
    assert status == "mismatch" and "digests match" in error  # the KV came whole: the decode used it wrongly


def test_serving_reports_a_digest_failure_as_a_mismatch_as_offline_runs_do():
    rows = serve_rows()
    rows[0].update(digest_match=False)
    s = serve_summary_of(rows)
    assert s["status"] == "mismatch" and s["exit_code"] == 1 and s["error"].startswith("1 of 3 transfers")


def test_serving_judges_faulted_and_aborted_requests_apart():
    """runner=serve under a scenario, as offline: a faulted request that failed with a reason (or
    was recomputed to the right output) is a caught fault, not a failed request; one that ended
    as if nothing happened is a missed fault; an aborted request is cancelled, not judged."""
    rows = serve_rows(4)
    rows[1].update(fault="drop", status="failed", error="HTTP 500", match=None, digest_match=None,
                   transfer_error="no KV arrived for transfer t within 5 s")
    rows[2].update(fault="delay", kv_recomputed=True)  # recomputed to the right output
    rows[3].update(aborted="client", status="cancelled", match=None, transfer_error="aborted")
    s = serve_summary_of(rows)
    assert s["status"] == "ok", s["error"]
    assert (s["faults_injected"], s["faults_caught"], s["faults_missed"], s["aborted"]) == (2, 2, 0, 1)
    assert s["transfer_errors"] == 0 and s.get("kv_recomputed", 0) == 0 and s["failed"] == 1
    rows[2].update(kv_recomputed=False)  # the delayed KV was used as if on time: the fault went unseen
    s = serve_summary_of(rows)
    assert s["status"] == "fault_missed" and s["error"].startswith("1 of 2 injected transport faults")
    rows[2].update(kv_recomputed=True, match=False)  # recomputed, but to another output
    assert serve_summary_of(rows)["status"] == "fault_missed"


def test_a_scenario_is_judged_by_what_it_declares_its_run_must_show():
    summary = {**CLEAN, "faults_injected": 2, "faults_caught": 2, "decode_preemptions": 0}
    assert unmet(summary, {"faults_injected": ">= 1", "faults_caught": "== faults_injected"}) == []
    assert unmet(summary, {"decode_preemptions": ">= 1", "aborted": "> 0"}) == [
        "decode_preemptions >= 1 (the run showed decode_preemptions 0)", "aborted > 0 (the run showed aborted None)"]
    assert unmet({**summary, "faults_caught": 1}, {"faults_caught": "== faults_injected"}) == [
        "faults_caught == faults_injected (the run showed faults_caught 1, faults_injected 2)"]
    status, error = judge(CLEAN, noise=0, scenario_unmet=unmet(summary, {"decode_preemptions": ">= 1"}))
    assert status == "scenario_unmet" and error == ("the scenario expects decode_preemptions >= 1 (the run showed "
                                                    "decode_preemptions 0)")
    # any other failure comes first: what went wrong explains what the scenario did not show
    assert judge({**CLEAN, "digest_failures": 1}, noise=0, scenario_unmet=["x >= 1"])[0] == "mismatch"
    with pytest.raises(ValueError, match="is not a condition"):
        unmet(summary, {"decode_preemptions": "at least 1"})
