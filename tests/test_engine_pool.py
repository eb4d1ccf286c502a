"""Engines kept between the runs of one process (harness/offline/engine_pool.py, run.reuse_engines):
which configurations share engines, and with real engines that a run on kept engines gives what
a run on fresh ones gives, writes its records in its own directory, and that nothing is left
once the pool closes."""


import psutil
import pytest

from harness.offline.deployment import OfflineDeployment
from harness.offline.engine_pool import POOL, EnginePool
from harness.settings import settle
from harness.workload import is_warmup
from tests.conftest import compose_config, run_harness
from tests.helpers.runs import left_in_shm, shm_now


def keys(tmp_path, name: str, *overrides: str) -> dict[str, str]:
    return OfflineDeployment(settle(compose_config("device=cpu", *overrides), "cpu"), tmp_path / name).keys


def test_engines_are_shared_by_runs_whose_engines_are_configured_the_same(tmp_path):
    first = keys(tmp_path, "a")
    assert keys(tmp_path, "b") == first  # another run directory: its records are named per request
    assert keys(tmp_path, "c", "workload.prompt_len=300", "workload=synthetic", "sampling.max_tokens=3") == first
    # the negative control travels with each decode request (kv_transfer_params' corrupt): the same engines
    assert keys(tmp_path, "d", "check.corrupt=true") == first
    checksums = keys(tmp_path, "g", "check.checksums=true")  # the connector's configuration: a fresh pair
    assert checksums["baseline"] == first["baseline"] and checksums["disagg"] != first["disagg"]
    other = keys(tmp_path, "e", "engine.block_size=64")  # every engine's
    assert other["baseline"] != first["baseline"] and other["disagg"] != first["disagg"]
    assert keys(tmp_path, "f", "strategy=layerwise")["disagg"] != first["disagg"]
    # vLLM's NIXL connector with the observer: a side-channel port and records paths per run, one pair
    nixl = keys(tmp_path, "h", "strategy=vllm_nixl")
    assert keys(tmp_path, "i", "strategy=vllm_nixl", "check.corrupt=true") == nixl and nixl["disagg"] != first["disagg"]


class StubEngine:
    """What the pool asks of an engine: is its process alive, and stop it."""

    def __init__(self, name: str):
        self.name, self.stopped = name, False
        self.proc = self

    def is_alive(self) -> bool:
        return not self.stopped

    def stop(self, grace_s: float = 0) -> None:
        self.stopped = True


def test_the_pool_keeps_the_sets_used_most_recently_up_to_its_capacity():
    pool, engines = EnginePool(), {k: StubEngine(k) for k in "abc"}

    def run(key: str, capacity: int) -> bool:
        """A run's use of the baseline slot: taken, or started fresh; handed back at its end."""
        kept = pool.take("baseline", key, capacity)
        if kept is None:
            engines[key] = StubEngine(key)
        pool.keep("baseline", key, [engines[key]], lambda: None, capacity)
        return kept is not None

    assert [run(k, 2) for k in "abab"] == [False, False, True, True]  # two configurations alternating: both kept
    first_b = engines["b"]
    assert run("c", 2) is False and engines["a"].stopped and not first_b.stopped  # a was used least recently
    assert run("b", 2) is True and engines["b"] is first_b
    # capacity 1: whatever is kept is stopped before a fresh set starts (no more engines alive than a run starts)
    assert run("a", 1) is False and first_b.stopped and engines["c"].stopped
    assert {e.name for e in pool._kept["baseline"][0].engines} == {"a"}
    dead_a = engines["a"]
    dead_a.stopped = True  # died while kept: not taken, started fresh
    assert run("a", 1) is False and engines["a"] is not dead_a
    pair = StubEngine("d")
    pool.keep("disagg", "d", [pair], lambda: None)
    pool.close("disagg")  # one slot: the other's sets stay
    assert pair.stopped and not engines["a"].stopped
    pool.close()
    assert engines["a"].stopped and pool.pids() == set()


def measured(records: list[dict]) -> dict[int, dict]:
    """A run's transfer records by prompt index (transfer id <run tag>-<index>; the warm-up's -1 left out)."""
    return {int(r["transfer_id"].split("-", 1)[1]): r for r in records if not is_warmup(r["transfer_id"])}


def outputs_and_digests(run) -> tuple[list, list]:
    rows = sorted(run.jsonl("requests.jsonl"), key=lambda r: r["prompt_idx"])
    sent = measured(run.jsonl("prefill-transfers.jsonl"))
    return [r["token_ids"] for r in rows], [sent[r["prompt_idx"]]["digests"] for r in rows]


def dead(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.engine
def test_a_run_on_kept_engines_gives_what_a_fresh_one_gives_and_nothing_is_left_once_the_pool_closes(results_dir):
    POOL.close()  # from nothing: what earlier tests kept is not this test's
    shm_before = shm_now()
    overrides = ("strategy=fused", "workload=synthetic", "workload.prompt_len=70", "workload.num_prompts=6",
                 "sampling.max_tokens=8")
    first = run_harness(results_dir / "pool-first", *overrides)
    second = run_harness(results_dir / "pool-second", *overrides)
    for run in (first, second):
        assert run.code == 0, run.stderr[-3000:]
        assert run.summary["match_rate"] == 1.0 and run.summary["digest_failures"] == 0
    assert set(first.summary["engines_reused"].values()) == {False}
    assert set(second.summary["engines_reused"].values()) == {True}
    assert second.summary["engine_pids"] == first.summary["engine_pids"]
    assert set(second.summary["timings"]["engine_startup_s"].values()) == {0.0}
    assert second.summary["engine_logs"]["decode"] == str(first.run_dir / "decode.log")
    # the same outputs and the same KV (the prefix cache was emptied: every block sent again)
    assert outputs_and_digests(second) == outputs_and_digests(first)
    # each run's records in its own directory (one run tag in each), whoever started the engines
    for run in (first, second):
        for name in ("prefill-transfers.jsonl", "decode-transfers.jsonl", "decode-transfers.compute.jsonl"):
            records = run.jsonl(name)
            assert len(measured(records)) == 6 and len({r["transfer_id"].split("-")[0] for r in records}) == 1
    assert not (second.run_dir / "decode.log").exists()

    cold = run_harness(results_dir / "pool-cold", *overrides, "run.reuse_engines=false")
    assert cold.code == 0 and set(cold.summary["engines_reused"].values()) == {False}
    assert outputs_and_digests(cold) == outputs_and_digests(first)
    assert all(dead(pid) for pid in cold.summary["engine_pids"].values())  # not kept
    assert set(first.summary["engine_pids"].values()) <= POOL.pids()

    POOL.close()
    assert all(dead(pid) for pid in first.summary["engine_pids"].values())
    assert left_in_shm(shm_before) == set()
