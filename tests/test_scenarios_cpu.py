"""The scenarios (conf/scenario) on CPU: each provokes what it names, and every built-in strategy
passes it. Pressure: outputs and digests match, no block held, every recompute explained by a
preemption. Transport faults: each faulted transfer is caught (the request fails with its reason
or is recomputed to the right output, as vLLM's kv_load_failure_policy says), the others match,
nothing hangs past the transfer timeout."""

import os

import psutil
import pytest

from harness.offline.engine_pool import POOL
from harness.resolvers import built_in_strategies
from tests.conftest import FULL, cells, run_harness
from tests.helpers.runs import check_faults_caught, check_passed

pytestmark = pytest.mark.engine

STRATEGIES = built_in_strategies(lossy=False)  # the lossy ones: test_lossy_cpu.py
# make test runs each scenario once, the strategies spread over them; make test-full every cell
KEPT = {"decode_preemption": "fused", "prefill_reuse": "per_request_blocks", "drop": "layerwise", "delay": "fused",
        "truncate": "full_cache", "flip": "per_request_blocks", "aborts": "layerwise", "aborts_parked": "layerwise"}


def strategies(scenario: str) -> list:
    return cells(STRATEGIES, {KEPT[scenario]})


def scenario_cells(kinds: list[str]) -> list:
    """(kind, strategy) pairs of the fault scenarios, each kind's kept strategy in make test."""
    return [pytest.param(k, s, marks=() if KEPT[k] == s else FULL, id=f"{k}-{s}") for k in kinds for s in STRATEGIES]


@pytest.mark.parametrize("strategy", strategies("decode_preemption"))
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


@pytest.mark.parametrize("strategy", strategies("prefill_reuse"))
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


# Ordered so that runs configured alike follow each other (a fault travels with its request, so
# only the timeout, vLLM's failure policy and the checksums set a P/D pair apart): in make test the
# drop run's layerwise pair serves the aborts, the delay run's fused pair the flips without checksums
@pytest.mark.parametrize(("kind", "strategy"), scenario_cells(["drop", "delay"]))
def test_a_transfer_that_never_comes_in_time_is_failed_or_recomputed_at_the_timeout(results_dir, kind, strategy):
    run = run_harness(results_dir / f"scenario-fault_{kind}-{strategy}", f"scenario=fault_{kind}",
                      f"strategy={strategy}")
    check_faults_caught(run, kind)
    assert run.summary["timings"]["disagg_s"] < 2 * 5 + 10  # two requests waited the 5 s timeout, no longer


def test_bit_flips_without_checksums_are_reported_as_missed(results_dir):
    """The decode engine cannot see them: it uses the damaged KV. The digests do, and the run
    says the faults went unseen."""
    run = run_harness(results_dir / "scenario-fault_flip-no_checksums", "scenario=fault_flip", "check.checksums=false")
    assert run.code == 1, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "fault_missed" and s["faults_missed"] == 2
    faulted = [r for r in run.jsonl("requests.jsonl") if r["fault"]]
    assert all(r["digest_match"] is False and r["error"] is None for r in faulted)


@pytest.mark.parametrize(("name", "strategy"), scenario_cells(["aborts", "aborts_parked"]))
def test_requests_aborted_at_random_points_leave_nothing_held(results_dir, name, strategy):
    """aborts: half of the prompts aborted during their prefill, transfer or decode, on either
    engine or both; aborts_parked: their decode requests only, most while parked for their KV.
    No KV block, staging region or transfer stays held, and the rest run normally."""
    run = run_harness(results_dir / f"scenario-{name}-{strategy}", f"scenario={name}", f"strategy={strategy}")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["requests"] == 16 and s["aborted"] >= 4
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}
    assert s["transfer_held"] == {"prefill": {"staging_regions": 0}, "decode": {"transfers": 0, "parked": 0}}
    rows = run.jsonl("requests.jsonl")
    assert sum(bool(r["aborted"]) for r in rows) == s["aborted"]
    if name == "aborts_parked":
        assert {r["aborted"] for r in rows if r["aborted"]} == {"decode"}
    assert all(r["match"] and r["digest_match"] for r in rows if not r["aborted"])
    assert s["timings"]["disagg_s"] < 30  # an aborted prefill's decode request fails at the 5 s timeout


@pytest.mark.parametrize(("kind", "strategy"), scenario_cells(["truncate", "flip"]))
def test_a_transfer_that_arrives_damaged_is_caught_on_arrival(results_dir, kind, strategy):
    run = run_harness(results_dir / f"scenario-fault_{kind}-{strategy}", f"scenario=fault_{kind}",
                      f"strategy={strategy}")
    check_faults_caught(run, kind)


@pytest.mark.parametrize("transport", cells(["nixl", "gloo"], {"nixl"}))
def test_a_damaged_transfer_is_caught_over_each_transport(results_dir, transport):
    """The cells above run over staged buffers; a payload damaged before a NIXL write or a gloo
    send is caught on arrival the same way, and the clean ones arrive whole."""
    run = run_harness(results_dir / f"scenario-fault_flip-{transport}", "scenario=fault_flip", "strategy=fused",
                      f"transport={transport}")
    check_faults_caught(run, "flip")


@pytest.mark.parametrize("prefill_tp", cells([1, 2], {1}))
def test_a_prefill_worker_dying_mid_transfer_stops_the_run(results_dir, prefill_tp):
    """prefill_tp 2: the engine's workers are processes of their own (both die, each on its third
    transfer) and the decode worker joins their heads: the harness may see either engine die
    first (the decode worker's channels close under it), and must stop both."""
    run = run_harness(results_dir / f"scenario-sender_dies-tp{prefill_tp}", "strategy=custom",
                      "strategy.name=dies_mid_send", "strategy.module=tests.crashing_strategy",
                      "strategy.connector=DiesMidSend", "sampling.max_tokens=4", "run.request_timeout_s=60",
                      f"engines.prefill={{tensor_parallel_size:{prefill_tp}}}")
    assert run.code == 3, run.stderr[-3000:]
    assert ("prefill engine" if prefill_tp == 1 else "engine") in run.stderr and "died" in run.stderr
    assert run.summary["status"] == "engine_failed" and run.summary["timings"]["total_s"] < 150
    assert len(run.jsonl("baseline.jsonl")) == 4 and len(run.jsonl("requests.jsonl")) == 1
    for name, pid in run.summary["engine_pids"].items():
        if name == "baseline" and pid in POOL.pids():  # idle since its passes ended: kept for the next run
            continue
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        # nor any of its processes (tensor-parallel workers): each engine leads a process group
        assert not _alive_in_group(pid)


def _alive_in_group(pgid: int) -> list[int]:
    alive = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive
