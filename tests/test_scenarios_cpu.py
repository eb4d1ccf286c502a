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
from harness.workload import is_warmup
from tests.conftest import FULL, ROOT, cells, run_harness
from tests.helpers.runs import FAULTS, check_faults_caught

pytestmark = pytest.mark.engine

STRATEGIES = built_in_strategies(lossy=False)  # the lossy ones: test_lossy_cpu.py
# Every scenario YAML but none, as the strategy matrix is every strategy YAML: a new scenario is
# enrolled by its file. Known ones in an order where runs configured alike follow each other (a
# fault travels with its request, so only the timeout, vLLM's failure policy and the checksums set
# a P/D pair apart: in make test the drop run's layerwise pair serves the aborts); new ones last.
ORDER = ["decode_preemption", "prefill_reuse", "fault_drop", "aborts", "aborts_parked", "fault_delay",
         "fault_truncate", "fault_flip"]
SCENARIOS = sorted((p.stem for p in (ROOT / "conf" / "scenario").glob("*.yaml") if p.stem != "none"),
                   key=lambda s: (ORDER.index(s) if s in ORDER else len(ORDER), s))
# make test runs each scenario once, the strategies spread over them; make test-full every cell
KEPT = {"decode_preemption": "fused", "prefill_reuse": "per_request_blocks", "fault_drop": "layerwise",
        "fault_delay": "fused", "fault_truncate": "full_cache", "fault_flip": "per_request_blocks",
        "aborts": "layerwise", "aborts_parked": "layerwise"}


def kept(scenario: str) -> str:
    return KEPT.get(scenario, STRATEGIES[SCENARIOS.index(scenario) % len(STRATEGIES)])


def preempted_requests_end_correctly(run) -> None:
    """Before the fix a preempted decode request waited again for KV it had already taken, and
    failed at run.transfer_timeout_s; now it comes back from the decode engine's prefix cache or
    is recomputed, and its row says which."""
    for r in run.jsonl("requests.jsonl"):
        assert r["error"] is None
        if not r["decode_preemptions"]:
            assert r["decode_computed_tokens"] == 1 and not r["kv_recomputed"]


def reused_blocks_are_sent_intact(run) -> None:
    sends = [r for r in run.jsonl("prefill-transfers.jsonl") if not is_warmup(r["transfer_id"])]
    assert len(sends) == 4
    seen: set[int] = set()
    reused = 0
    for r in sorted(sends, key=lambda r: r["t_admitted"]):
        reused += bool(seen & set(r["block_ids"]))
        seen |= set(r["block_ids"])
    assert reused, "the scenario should have handed a sent request's blocks to a later request"


def aborted_requests_leave_nothing_held(run) -> None:
    """aborts: half of the prompts aborted during their prefill, transfer or decode, on either
    engine or both; aborts_parked: their decode requests only, most while parked for their KV.
    No KV block, staging region or transfer stays held, and the rest run normally."""
    s = run.summary
    assert s["requests"] == 16 and s["aborted"] >= 4
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}
    assert s["transfer_held"] == {"prefill": {"staging_regions": 0}, "decode": {"transfers": 0, "parked": 0}}
    rows = run.jsonl("requests.jsonl")
    assert sum(bool(r["aborted"]) for r in rows) == s["aborted"]
    if s["run_id"].startswith("scenario-aborts_parked"):
        assert {r["aborted"] for r in rows if r["aborted"]} == {"decode"}
    assert all(r["match"] and r["digest_match"] for r in rows if not r["aborted"])


# Beyond the run's status (which judges each YAML's expect), what each scenario's rows show
ROWS = {"decode_preemption": preempted_requests_end_correctly, "prefill_reuse": reused_blocks_are_sent_intact,
        "aborts": aborted_requests_leave_nothing_held, "aborts_parked": aborted_requests_leave_nothing_held,
        **{f"fault_{kind}": lambda run, kind=kind: check_faults_caught(run, kind) for kind in FAULTS}}


@pytest.mark.parametrize(("scenario", "strategy"), [
    pytest.param(s, st, marks=() if kept(s) == st else FULL, id=f"{s}-{st}") for s in SCENARIOS for st in STRATEGIES])
def test_each_scenario_provokes_what_it_names_and_shows_what_it_declares(results_dir, scenario, strategy):
    """The run ends ok: every check of every run, and the scenario's own `expect` (its YAML: what
    summary.json must show, judged by the verdict); then what the scenario's rows show. No request
    the scenario left alone failed (none waited out the transfer timeout for KV it should have had),
    however long the machine took."""
    run = run_harness(results_dir / f"scenario-{scenario}-{strategy}", f"scenario={scenario}", f"strategy={strategy}",
                      *(["run.transfer_timeout_s=30"] if scenario == "decode_preemption" else []))
    assert run.code == 0, run.stderr[-3000:]
    assert run.summary["status"] == "ok"
    ROWS.get(scenario, lambda run: None)(run)
    assert all(r["error"] is None for r in run.jsonl("requests.jsonl") if not r["fault"] and not r["aborted"])


def test_a_scenario_whose_run_does_not_show_what_it_declares_fails(results_dir):
    """fault_flip with its fault taken away (on the engines of the cell before: a fault travels
    with its request): every output still matches, but the run did not provoke what the scenario
    is for, and says so."""
    run = run_harness(results_dir / "scenario-fault_flip-unmet", "scenario=fault_flip", "scenario.fault=null",
                      f"strategy={kept('fault_flip')}")
    assert run.code == 1, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "scenario_unmet" and s["mismatches"] == 0 and "faults_injected" not in s
    assert s["error"] == ("the scenario expects faults_injected >= 1 (the run showed faults_injected None); "
                          "faults_caught == faults_injected (the run showed faults_caught None)")


def test_bit_flips_without_checksums_are_reported_as_missed(results_dir):
    """The decode engine cannot see them: it uses the damaged KV. The digests do, and the run
    says the faults went unseen."""
    run = run_harness(results_dir / "scenario-fault_flip-no_checksums", "scenario=fault_flip", "check.checksums=false")
    assert run.code == 1, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "fault_missed" and s["faults_missed"] == 2
    faulted = [r for r in run.jsonl("requests.jsonl") if r["fault"]]
    assert all(r["digest_match"] is False and r["error"] is None for r in faulted)


@pytest.mark.parametrize("transport", cells(["nixl", "gloo"], {"nixl"}))
def test_a_damaged_transfer_is_caught_over_each_transport(results_dir, transport):
    """The cells above run over staged buffers; a payload damaged before a NIXL write or a gloo
    send is caught on arrival the same way, and the clean ones arrive whole."""
    run = run_harness(results_dir / f"scenario-fault_flip-{transport}", "scenario=fault_flip", "strategy=fused",
                      f"transport={transport}")
    check_faults_caught(run, "flip")


@pytest.mark.parametrize("prefill_tp", cells([1, 2], {1}))
def test_a_prefill_worker_dying_mid_transfer_stops_the_run(results_dir, prefill_tp):
    """prefill_tp 2: the engine's workers are processes of their own (both die, each on its second measured
    transfer) and the decode worker joins their heads: the harness may see either engine die
    first (the decode worker's channels close under it), and must stop both."""
    run = run_harness(results_dir / f"scenario-sender_dies-tp{prefill_tp}", "strategy=custom",
                      "strategy.name=dies_mid_send", "strategy.module=tests.crashing_strategy",
                      "strategy.connector=DiesMidSend", "sampling.max_tokens=4", "run.request_timeout_s=60",
                      f"engines.prefill={{tensor_parallel_size:{prefill_tp}}}")
    assert run.code == 3, run.stderr[-3000:]
    assert ("prefill engine" if prefill_tp == 1 else "engine") in run.stderr and "died" in run.stderr
    assert run.summary["status"] == "engine_failed" and "died" in run.summary["error"]
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
