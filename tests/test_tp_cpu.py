"""Tensor parallelism end to end on CPU: prefill and decode engines of TP 1 and 2 (vLLM's CPU build
runs TP 2 here, a worker process per rank), KV moved by every strategy between them, every
output compared with the colocated baseline (TP 1) and every KV head's digests checked.

The tiny model has 2 KV heads: at TP 2 each worker holds one. 1 -> 2: the prefill worker cuts
its blocks by head, one head to each decode worker. 2 -> 1: the decode worker joins the two
prefill workers' heads. 2 -> 2: worker to worker. At TP 4 each head is on two workers (1 -> 4,
4 -> 2). The negative control damages the KV on every
decode worker, and every one of them must see it.
"""

import json

import pytest

from harness.offline.engine_pool import POOL
from harness.resolvers import built_in_strategies
from tests.conftest import FULL, ROOT, cells, run_harness
from tests.helpers.runs import (
    check_faults_caught,
    edge_prompts,
    harness_on_edge_prompts,
    left_in_shm,
    shm_now,
    worker_records,
)
from transfer_strategies.tp import heads_of

pytestmark = pytest.mark.engine

N_HEADS = json.loads((ROOT / "models" / "tiny-llama" / "config.json").read_text())["num_key_value_heads"]
STRATEGIES = built_in_strategies(lossy=False)  # the lossy ones: test_lossy_cpu.py (equal degrees)
DEGREES = [(1, 2), (2, 1), (2, 2)]


def tp_overrides(p: int, d: int) -> list[str]:
    return [f"engines.prefill={{tensor_parallel_size:{p}}}", f"engines.decode={{tensor_parallel_size:{d}}}"]


# More workers than KV heads, as vLLM replicates them: 1 -> 4 sends each head to two decode
# workers; at 4 -> 2 two prefill workers hold each head (their copies may differ in the last bits,
# records.digests_agree) and each decode worker takes its head from one of them. Four workers of
# an engine on 2 cores: one strategy is enough to show the mapping.
REPLICATED = [("fused", 1, 4), ("fused", 4, 2)]


# make test: each degree pair once, the strategies spread over them; make test-full every cell
KEPT = {("fused", 1, 2), ("per_request_blocks", 2, 1), ("layerwise", 2, 2)}


# chunkwise at equal degrees only: its earlier messages do not carry the count a decode worker
# joining several prefill workers' heads needs (transfer_strategies/chunkwise.py)
CELLS = [(s, p, d) for p, d in DEGREES for s in STRATEGIES if s != "chunkwise" or p == d]


@pytest.fixture(scope="module", params=cells(CELLS + REPLICATED, KEPT,
                                             ids=lambda c: f"{c[0]}-{c[1]}to{c[2]}"))
def tp_run(request, results_dir, tmp_path_factory):
    strategy, p, d = request.param
    POOL.close()  # what earlier runs kept is not this run's
    shm_before = shm_now()
    run = harness_on_edge_prompts(results_dir, tmp_path_factory, f"tp-{strategy}-{p}to{d}", f"strategy={strategy}",
                                  *tp_overrides(p, d))
    run.degrees = (p, d)
    POOL.close()  # the engines this run kept for the next one: what they leave is the run's
    run.shm_left = left_in_shm(shm_before)
    return run


def test_every_output_and_every_heads_digest_match(tp_run):
    assert tp_run.code == 0, tp_run.stderr[-3000:]
    s = tp_run.summary
    n = len(edge_prompts())
    assert s["status"] == "ok" and s["requests"] == n and s["match_rate"] == 1.0
    # every transfer that wrote a block judged (the one-token prompt's wrote none), its
    # decode-side prefix-cache hits not: at 2 -> 1 the decode engine's own token in a cached block
    # differs from the prefill's in the last bits
    assert s["digest_checked"] == n - 1 and s["digest_failures"] == 0 and s["transfer_errors"] == 0
    assert not s["kv_recomputed"]  # each decode engine used the KV, on every worker
    # nothing held at the end, counted on every worker of each engine
    assert s["transfer_held"]["prefill"] == {"staging_regions": 0}
    assert s["transfer_held"]["decode"] == {"transfers": 0, "parked": 0}
    assert set(s["kv_blocks_in_use"].values()) == {0}
    # nor in /dev/shm: the CPU build's all-reduce buffers between TP workers (8 MiB each), the
    # project's staging, semaphores; none is removed by vLLM when the harness kills its engines
    assert tp_run.shm_left == set()


def test_each_worker_digests_its_own_heads_and_together_they_cover_the_model(tp_run):
    p, d = tp_run.degrees
    for side, tp in (("send", p), ("receive", d)):
        per_rank = worker_records(tp_run, side, tp)
        assert all(len(records) == len(edge_prompts()) for records in per_rank)
        for rank, records in enumerate(per_rank):
            assert {tuple(r["digests"]) for r in records} == {tuple(str(h) for h in heads_of(rank, tp, N_HEADS))}
            assert {r["rank"] for r in records} == {rank}
    assert all(r["digest_match"] is (True if r["blocks"] > r["skip_blocks"] else None)
               for r in tp_run.jsonl("requests.jsonl"))

    def bytes_by_transfer(side, tp):
        out = {}
        for records in worker_records(tp_run, side, tp):
            for r in records:
                out[r["transfer_id"]] = out.get(r["transfer_id"], 0) + r["bytes"]
        return out
    # what the prefill workers sent, the decode workers received: no head lost or sent twice
    assert bytes_by_transfer("send", p) == bytes_by_transfer("receive", d)


@FULL  # the negative control (tests/test_e2e_cpu.py) and TP's digests per head (above) are in make test
@pytest.mark.parametrize(("p", "d"), [(1, 2), (2, 1)])
def test_the_negative_control_is_caught_on_every_decode_worker(p, d, results_dir, tmp_path_factory):
    run = harness_on_edge_prompts(results_dir, tmp_path_factory, f"tp-negative-{p}to{d}", "strategy=fused",
                                  "check.corrupt=true", *tp_overrides(p, d))
    assert run.code == 1, run.stderr[-3000:]
    received = [r for r in run.jsonl("requests.jsonl") if r["blocks"] and r["blocks"] > (r["skip_blocks"] or 0)]
    assert received and all(r["digest_match"] is False for r in received)
    sent: dict[str, dict] = {}  # every prefill worker's heads, per transfer
    for records in worker_records(run, "send", p):
        for r in records:
            sent.setdefault(r["transfer_id"], {}).update(r["digests"])
    for records in worker_records(run, "receive", d):  # every worker, every head of the damaged block
        damaged = [r for r in records if r["blocks"] > r["skip_blocks"]]
        assert damaged
        for r in damaged:
            first = r["skip_blocks"]  # the receiver digests the blocks written, from its first
            assert all(r["digests"][h][0] != sent[r["transfer_id"]][h][first] for h in r["digests"])


# Transport faults with TP: the prefill workers damage or drop their own messages (every 2nd
# transfer); every decode worker must see what reaches it, and vLLM's aggregator fail or
# recompute the request as one. 2 -> 1 joins the parts, 1 -> 2 cuts them, 2 -> 2 waits per worker.
@pytest.mark.parametrize(("kind", "strategy", "p", "d"), [
    ("truncate", "fused", 2, 1), ("flip", "fused", 1, 2), ("drop", "layerwise", 2, 2)])
@FULL  # each fault scenario at TP 1 and each degree pair are in make test
def test_transport_faults_are_caught_on_every_worker(kind, strategy, p, d, results_dir):
    POOL.close()
    shm_before = shm_now()
    # six processes on two cores: a prefill forward can take seconds, and an undamaged transfer
    # must not miss the drop scenario's 5 s wait (seen once in a fresh-clone run: a correct one missed
    # it); twice that is the margin, as each dropped transfer's request waits all of it
    wait = ["run.transfer_timeout_s=10"] if kind == "drop" else []
    run = run_harness(results_dir / f"tp-fault_{kind}-{strategy}-{p}to{d}", f"scenario=fault_{kind}",
                      f"strategy={strategy}", *tp_overrides(p, d), *wait)
    check_faults_caught(run, kind)
    assert not any(any(h.values()) for h in run.summary["transfer_held"].values())
    POOL.close()
    assert left_in_shm(shm_before) == set()
