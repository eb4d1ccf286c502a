"""The pressure scenarios (conf/scenario) on CPU, every built-in strategy: each provokes what
it names, and a correct strategy passes it (outputs and digests match, no block held, every
recompute explained by a preemption)."""

import pytest

from tests.conftest import run_harness

pytestmark = pytest.mark.engine

STRATEGIES = ["fused", "per_request_blocks", "layerwise", "full_cache"]


def check_passed(run) -> dict:
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["requests"] == 4
    assert s["digest_failures"] == 0 and s["digest_checked"] == 4
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}
    assert s["kv_recomputed"] == s["kv_recomputed_preempted"]
    return s


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_decode_requests_preempted_after_their_kv_came_end_correctly(results_dir, strategy):
    """Before the fix a preempted decode request waited again for KV it had already taken, and
    failed at run.transfer_timeout_s; now it comes back from the decode engine's prefix cache
    or is recomputed, and its row says which."""
    run = run_harness(results_dir / f"scenario-decode_preemption-{strategy}", "scenario=decode_preemption",
                      f"strategy={strategy}", "run.transfer_timeout_s=30")
    s = check_passed(run)
    assert s["decode_preemptions"] >= 1, "the scenario should have preempted a decode request"
    rows = run.jsonl("requests.jsonl")
    for r in rows:
        assert r["error"] is None
        if not r["decode_preemptions"]:
            assert r["decode_computed_tokens"] == 1 and not r["kv_recomputed"]
    assert s["timings"]["disagg_s"] < 30  # nobody waited for the transfer timeout


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_prefill_blocks_reused_right_after_a_send_are_sent_intact(results_dir, strategy):
    run = run_harness(results_dir / f"scenario-prefill_reuse-{strategy}", "scenario=prefill_reuse",
                      f"strategy={strategy}")
    check_passed(run)
    sends = [r for r in run.jsonl("prefill-transfers.jsonl") if not r["transfer_id"].endswith("--1")]
    assert len(sends) == 4
    seen: set[int] = set()
    reused = 0
    for r in sorted(sends, key=lambda r: r["t_admitted"]):
        reused += bool(seen & set(r["block_ids"]))
        seen |= set(r["block_ids"])
    assert reused, "the scenario should have handed a sent request's blocks to a later request"
