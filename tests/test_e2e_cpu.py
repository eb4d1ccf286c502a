"""End to end on CPU with real vLLM engines: baseline, prefill and decode, KV moved by each
strategy, every output compared with the baseline and every transfer's digests checked.

One harness run per strategy (a module fixture) serves every test of that strategy. Its
prompts (edge_prompts, tests/helpers/runs.py) cover the edge cases real connectors break on:
shorter than one block, exactly one block, one token past a block, a long prompt, two prompts
sharing a two-block prefix (the second arrives after the first has finished, so both engines'
prefix caches hit), and several requests in flight at once, and two prompts extending an earlier
one that ended on a block boundary (the decode engine computed that block's last slot itself and
cached it: the transfers must not be judged on it).
"""

import json

import psutil
import pytest

from harness.offline.engine_pool import POOL
from harness.records.critical_path import TIMELINE
from harness.records.schema import OVERHEAD_PARTS
from harness.resolvers import built_in_strategies
from harness.workload import is_warmup
from tests.conftest import FULL, ROOT, cells, compose_config, run_harness, write_token_prompts
from tests.helpers.runs import BLOCK, EXTENDED, SHARED_PREFIX, edge_prompts, harness_on_edge_prompts

pytestmark = pytest.mark.engine

N_LAYERS = json.loads((ROOT / "models" / "tiny-llama" / "config.json").read_text())["num_hidden_layers"]

CASES = {
    # a new strategy's YAML enrolls it (a lossy one in test_lossy_cpu.py: its outputs may differ)
    **{name: [f"strategy={name}"] for name in built_in_strategies(lossy=False)},
    "per_request_blocks-per_block-bs64": ["strategy=per_request_blocks", "strategy.params.granularity=block",
                                          "engine.block_size=64"],
    # an outside strategy with a parameter of its own, loaded by module path
    "custom-two_halves": ["strategy=custom", "strategy.name=two_halves", "strategy.module=examples.two_halves",
                          "strategy.connector=TwoHalvesConnector", "strategy.params={split:1}"],
    # chunkwise with prefill steps of 64 tokens: the long prompts leave in chunks
    "chunkwise": ["strategy=chunkwise", "engines.prefill={max_num_batched_tokens:64,max_num_seqs:8}"],
    # with the no-transfer control: the decode engine alone, after the P/D pass
    "fused": ["strategy=fused", "run.no_transfer_control=true"],
    # the hand-off: the decode request goes once the prefill engine has answered
    "fused-after_prefill": ["strategy=fused", "run.decode_submit=after_prefill"],
    # every prompt in flight at once: all decode requests parked together
    "layerwise-all_in_flight": ["strategy=layerwise", "workload.concurrency=11"],
}


def expected_messages(case: str, blocks: int) -> int | None:
    return {"fused": 1, "fused-after_prefill": 1, "per_request_blocks": N_LAYERS, "layerwise": N_LAYERS,
            "layerwise-all_in_flight": N_LAYERS, "full_cache": N_LAYERS + 1,
            "per_request_blocks-per_block-bs64": max(N_LAYERS * blocks, 1), "custom-two_halves": 2}.get(case)


# make test: each built-in strategy once; the other cells (an outside strategy, per-block
# messages, the hand-off after the prefill, every request in flight) in make test-full
@pytest.fixture(scope="module", params=cells(CASES, set(built_in_strategies(lossy=False))))
def strategy_run(request, results_dir, tmp_path_factory):
    run = harness_on_edge_prompts(results_dir, tmp_path_factory, request.param, *CASES[request.param])
    run.case = request.param
    return run


def test_every_output_matches_the_baseline(strategy_run):
    assert strategy_run.code == 0, strategy_run.stderr[-3000:]
    s = strategy_run.summary
    assert s["status"] == "ok" and s["requests"] == len(edge_prompts())
    assert s["match_rate"] == 1.0 and s["mismatches"] == 0
    # the baseline's own noise, measured on a second pass (run.baseline_repeat)
    assert len(strategy_run.jsonl("baseline_repeat.jsonl")) == len(edge_prompts())
    assert isinstance(s["baseline_self_mismatches"], int) and 0 <= s["baseline_self_match_rate"] <= 1
    assert "match" in strategy_run.stdout and "GB/s" in strategy_run.stdout


def test_the_no_transfer_control_has_the_decode_engine_compute_every_prompt_itself(strategy_run):
    """run.no_transfer_control (fused's run): after the P/D pass, every prompt through the decode
    engine alone at the same concurrency; its mismatches against the baseline are the floor an
    exact match is read against, beside the baseline's own repeat."""
    if strategy_run.case != "fused":
        pytest.skip("fused's run takes the control")
    rows, base = strategy_run.jsonl("control.jsonl"), strategy_run.jsonl("baseline.jsonl")
    assert sorted(r["prompt_idx"] for r in rows) == list(range(len(edge_prompts())))
    assert all(len(r["token_ids"]) == 8 for r in rows)  # sampling.max_tokens
    ours = {b["prompt_idx"]: b["token_ids"] for b in base}
    same = sum(r["token_ids"] == ours[r["prompt_idx"]] for r in rows)
    s = strategy_run.summary
    assert s["control_mismatches"] == len(rows) - same and s["control_match_rate"] == same / len(rows)
    assert "decode engine alone, no transfer" in strategy_run.stdout


def test_the_decode_engine_used_the_kv_it_was_sent(strategy_run):
    """vLLM's scheduler had the decode engine compute only each prompt's last token: the rest came
    from the connector or its own prefix cache (counted from its scheduler outputs)."""
    rows = strategy_run.jsonl("requests.jsonl")
    assert all(r["kv_recomputed"] is False and r["decode_computed_tokens"] == 1 for r in rows)
    assert all(r["decode_cached_tokens"] == r["prompt_len"] - 1 for r in rows)
    assert all(0 < r["decode_loaded_tokens"] <= r["prompt_len"] - 1 for r in rows if r["prompt_len"] > 1)
    assert strategy_run.summary["kv_recomputed"] == 0


def test_every_transfer_is_bit_identical(strategy_run):
    """Judged on the blocks each transfer wrote: a one-token prompt sends none (nothing to judge)."""
    rows = strategy_run.jsonl("requests.jsonl")
    assert [r["digest_match"] for r in rows] == [True if r["blocks"] > r["skip_blocks"] else None for r in rows]
    assert sum(r["blocks"] > r["skip_blocks"] for r in rows) >= len(rows) - 1
    assert strategy_run.summary["digest_failures"] == 0


def test_records_carry_latency_bytes_and_messages(strategy_run):
    rows = {r["prompt_idx"]: r for r in strategy_run.jsonl("requests.jsonl")}
    base = {r["prompt_idx"]: r for r in strategy_run.jsonl("baseline.jsonl")}
    prompts = edge_prompts(64 if "bs64" in strategy_run.case else BLOCK)
    block = 64 if "bs64" in strategy_run.case else BLOCK
    assert sorted(rows) == sorted(base) == list(range(len(prompts)))
    for i, r in rows.items():
        assert r["prompt_len"] == len(prompts[i]) and r["output_len"] == 8
        for k in ("ttft_ms", "e2e_ms", "base_ttft_ms", "base_e2e_ms", "prefill_ms"):
            assert r[k] > 0
        assert r["e2e_ms"] >= r["ttft_ms"]
        if "after_prefill" in strategy_run.case:
            assert r["ttft_ms"] >= r["prefill_ms"]
        elif r["blocks"] > r["skip_blocks"]:  # early: after its KV (the prefill's answer may come later)
            assert r["ttft_ms"] >= r["t_kv_ready_ms"]
        assert r["blocks"] == -(-(len(prompts[i]) - 1) // block)  # the blocks holding tokens [0, n-1)
        want = expected_messages(strategy_run.case, r["blocks"])
        if want is None:  # chunkwise: one a prefill step that completed blocks, then the rest
            assert 1 <= r["messages"] <= r["blocks"] + 1
        else:
            assert r["messages"] == want
        if strategy_run.case == "full_cache":
            assert r["bytes"] == r["kv_cache_bytes"] + 8 * r["blocks"]  # whole cache + the sender's block ids
        elif r["blocks"]:
            assert r["bytes"] % r["blocks"] == 0 and r["transfer_ms"] > 0 and r["gbps"] > 0
        else:
            assert r["bytes"] == 0


def test_chunkwise_sent_a_long_prompt_in_chunks_and_the_decode_worker_got_them_all(strategy_run):
    if strategy_run.case != "chunkwise":
        pytest.skip("chunkwise only")
    sends = {r["transfer_id"]: r for r in strategy_run.jsonl("prefill-transfers.jsonl")}
    recvs = {r["transfer_id"]: r for r in strategy_run.jsonl("decode-transfers.jsonl")}
    assert max(r["messages"] for r in sends.values()) >= 3  # the 150-token prompt in prefill steps of 64
    for tid, r in sends.items():
        assert recvs[tid]["messages"] == r["messages"] and recvs[tid]["bytes"] == r["bytes"], tid


def test_a_warm_up_request_went_through_the_connector_first_and_is_not_measured(strategy_run):
    sends = strategy_run.jsonl("prefill-transfers.jsonl")
    warmups = [r for r in sends if is_warmup(r["transfer_id"])]  # negative prompt indices
    # run.warmup_requests=1: a prompt as long as the longest of each power-of-two range the edge
    # prompts' lengths fall in (block 32: 150, 73, 64, 32, 5, 1), and at least a batch (workload.concurrency)
    ranges = {(r["prompt_len"] - 1).bit_length() for r in strategy_run.jsonl("requests.jsonl")}
    batch = json.loads((strategy_run.run_dir / "meta.json").read_text())["config"]["workload"]["concurrency"]
    assert len(warmups) == max(len(ranges), batch) and len(sends) == len(edge_prompts()) + len(warmups)
    assert max(r["blocks"] for r in warmups) == max(r["blocks"] for r in sends)
    assert min(r["blocks"] for r in warmups) == min(r["blocks"] for r in sends)
    assert len(strategy_run.jsonl("requests.jsonl")) == len(edge_prompts())
    assert strategy_run.summary["timings"]["warmup_s"] > 0
    assert set(strategy_run.summary["cudagraph_mode"]) == {"baseline", "prefill", "decode"}


def test_the_decode_request_went_early_and_waited_for_its_kv_in_vllm(strategy_run):
    early = "after_prefill" not in strategy_run.case
    assert strategy_run.summary["decode_submit"] == ("early" if early else "after_prefill")
    assert strategy_run.summary["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}  # no parked request left
    for r in strategy_run.jsonl("requests.jsonl"):
        t = {e: r[f"t_{e}_ms"] for e in TIMELINE}
        assert None not in t.values(), r
        assert 0 <= t["prefill_admitted"] <= t["forward_done"] <= t["sent"] and t["prefill_admitted"] < t["kv_ready"]
        assert t["decode_scheduled"] < t["first_token"]
        if "layerwise" not in strategy_run.case:  # layerwise's KV may be in before the forward pass is done
            assert r["kv_ms"] > 0
        assert r["after_forward_ms"] == t["first_token"] - t["forward_done"]
        if r["blocks"] > r["skip_blocks"]:  # a one-token prompt sends no block: its decode need not wait for the KV
            assert r["after_forward_ms"] > r["kv_ms"]
        if not early:  # the hand-off: the decode request follows the prefill's answer, its load its step
            assert t["decode_submitted"] >= t["prefill_token"] and t["load_start"] >= t["decode_scheduled"]
        elif r["blocks"] > r["skip_blocks"]:  # parked in vLLM until the KV was in its blocks
            assert t["decode_submitted"] < t["decode_admitted"] < t["kv_ready"] <= t["decode_scheduled"]


def test_the_ttft_overhead_parts_add_up_to_the_measured_overhead(strategy_run):
    rows = strategy_run.jsonl("requests.jsonl")
    timed = [r for r in rows if r["overhead_decode_ms"] is not None]
    assert len(timed) >= len(rows) - 1  # the one-token prompt may be all in the decode cache
    for r in timed:
        parts = sum(r[k] for k in OVERHEAD_PARTS)  # by construction, whatever the order of events
        assert abs(parts - r["ttft_overhead_ms"]) <= 1e-6 * abs(r["ttft_overhead_ms"]) + 1e-6
        assert all(r[k] >= 0 for k in OVERHEAD_PARTS if k != "overhead_prefill_ms")
    s = strategy_run.summary
    assert abs(sum(s["overhead_parts_mean_ms"].values()) - s["overhead_mean_ms"]) < 1e-6
    assert "ttft overhead mean" in strategy_run.stdout


def test_prefix_cache_hits_on_decode_side(strategy_run):
    if "all_in_flight" in strategy_run.case:
        pytest.skip("both prompts in flight at once: the first one's prefix is not cached yet")
    rows = {r["prompt_idx"]: r for r in strategy_run.jsonl("requests.jsonl")}
    first, second = SHARED_PREFIX
    assert rows[first]["skip_blocks"] == 0
    assert rows[second]["skip_blocks"] >= 1 and rows[second]["digest_match"] is True
    one_block, *extending = EXTENDED
    assert rows[one_block]["skip_blocks"] == 0
    for i in extending:  # the decode engine's own block (its last slot computed there) is not judged
        assert rows[i]["skip_blocks"] >= 1 and rows[i]["digest_match"] is True


def test_run_directory_has_config_versions_and_summary(strategy_run):
    """(Hydra's own copy, .hydra/, is there for a run from the command line: the vllm_nixl run's)"""
    d = strategy_run.run_dir
    meta = json.loads((d / "meta.json").read_text())
    assert meta["versions"]["vllm"] and meta["versions"]["torch"] and meta["versions"]["device"] == "cpu"
    assert "git_sha" in meta["versions"]
    s = strategy_run.summary
    for k in ("ttft_ms_p50", "ttft_ms_p90", "e2e_ms_p50", "base_ttft_ms_p90"):
        assert s[k] is not None


def test_no_engine_left_running(strategy_run):
    """Each engine is stopped, or kept for the session's next run whose engines are configured
    the same (harness/offline/engine_pool.py; what the pool keeps is stopped when it closes:
    tests/test_engine_pool.py)."""
    kept = POOL.pids()
    for pid in strategy_run.summary["engine_pids"].values():
        assert pid in kept or not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@FULL  # vLLM's connectors are proven by vllm_nixl in make test
def test_vllm_example_connector_on_multi_block_prompts(results_dir):
    """vLLM's own ExampleConnector (through files), unchanged, as a reference point. It keys its
    files by the prompt's whole blocks, so prompts under one block collide (the decode engine
    then reads files another request is still writing), and on the edge-case prompts above its
    prefill engine dies (IndexError in vLLM's _prepare_inputs; vLLM 0.32, CPU): it runs on
    prompts of several blocks."""
    run_dir = results_dir / "e2e-vllm_example"
    # its files' folder named outright (the YAML's names the run directory through Hydra's runtime,
    # which exists only in a run from the command line): the run goes in this process
    run = run_harness(run_dir, "strategy=vllm_example", f"strategy.params.shared_storage_path={run_dir}/kv",
                      "workload=synthetic", "workload.prompt_len=100", "workload.num_prompts=4",
                      "sampling.max_tokens=8")
    assert run.code == 0, run.stderr[-3000:]
    assert run.summary["match_rate"] == 1.0 and run.summary["requests"] == 4


# NIXL registers each engine's whole KV cache with UCX as it starts: 1 GiB (engine.kv_cache_gib's
# default) took 20-30 s on the 2-core machine
NIXL = ("strategy=vllm_nixl", "engine.kv_cache_gib=0.25")
# vLLM's connectors, unchanged, and what each is run with (vllm_nixl in make test)
VLLM_CONNECTORS = {"vllm_nixl": NIXL, "vllm_mooncake": ("strategy=vllm_mooncake", "engine.kv_cache_gib=0.25")}


@pytest.mark.parametrize("name", cells(list(VLLM_CONNECTORS), {"vllm_nixl"}))
def test_vllm_connectors_on_the_edge_prompts(results_dir, tmp_path_factory, name):
    """vLLM's own connectors, unchanged, on the same edge-case prompts as our strategies, three in
    flight. NixlConnector: the prefill engine keeps the KV and answers where it is, the harness
    relays that to the decode engine, which reads the blocks through NIXL (UCX on CPU memory).
    MooncakeConnector: the decode request names the prefill engine and its bootstrap server up
    front, and the prefill worker writes the blocks into the decode engine's through Mooncake's
    transfer engine (TCP). The observer beside each (transfer_strategies/observer.py) digests the
    blocks on both engines: each transfer is judged as this project's are, and the decode engine's
    compute records show the KV came through the connector, not from the engine computing the prompt."""
    run = harness_on_edge_prompts(results_dir, tmp_path_factory, name, *VLLM_CONNECTORS[name])
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["match_rate"] == 1.0 and s["requests"] == len(edge_prompts())
    rows = run.jsonl("requests.jsonl")
    loaded = [r for r in rows if r["blocks"] > r["skip_blocks"]]  # not every block in the decode engine's cache
    assert loaded and all(r["digest_match"] is True for r in loaded), rows
    assert s["digest_checked"] == len(loaded) and s["digest_failures"] == 0
    # the decode engine computed only the last prompt token: the rest was in its own prefix cache
    # (whole blocks) or loaded (vLLM computes the last token again after a whole prompt was loaded)
    assert all(r["decode_computed_tokens"] == 1 and not r["kv_recomputed"] for r in rows)
    assert all(r["decode_loaded_tokens"] == r["prompt_len"] - 1 - r["skip_blocks"] * BLOCK for r in rows)
    assert all(r["bytes"] is None and r["transfer_ms"] is None for r in rows)  # not seen from outside
    connector = compose_config(f"strategy={name}").strategy.connector
    assert all(r["strategy"] == connector for r in run.jsonl("decode-transfers.jsonl"))
    # no block held: the prefill engine frees its last ones on a step that hears the decode engine's
    # notice that the KV was read (NIXL) or written (Mooncake), which the idle engine takes
    # (engine_process._settle); its engines are kept for the next run (vllm_nixl's negative control)
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}


# The same prompt of two whole blocks twice, one at a time: the second time the decode engine holds
# all of it, but vLLM takes at most N-1 tokens of a cache hit (it computes the last token again),
# so it takes the first block from its cache and the connector must load the second's first 31
# tokens into a block of its own, no more (the N against N-1 case, which LMCache's and vLLM's
# issues report as outputs wrong from the first token while the logs look healthy)
@pytest.mark.parametrize("name", cells([*built_in_strategies(lossy=False), *VLLM_CONNECTORS], set()))
def test_a_prompt_the_decode_engine_holds_whole_loads_all_but_its_last_token(results_dir, tmp_path_factory, name):
    prompt = edge_prompts()[EXTENDED[1]]
    assert len(prompt) == 2 * BLOCK
    prompts = write_token_prompts(tmp_path_factory.mktemp(f"whole-{name}") / "prompts.jsonl", [prompt, prompt])
    run = run_harness(results_dir / f"e2e-whole-{name}", "workload=jsonl", f"workload.path={prompts}",
                      "workload.concurrency=1", "sampling.max_tokens=8",
                      *VLLM_CONNECTORS.get(name, (f"strategy={name}",)))
    assert run.code == 0, run.stderr[-3000:]
    first, again = sorted(run.jsonl("requests.jsonl"), key=lambda r: r["prompt_idx"])
    assert (first["skip_blocks"], first["decode_loaded_tokens"]) == (0, 2 * BLOCK - 1)
    assert (again["skip_blocks"], again["decode_loaded_tokens"], again["decode_computed_tokens"]) == (1, BLOCK - 1, 1)
    assert all(r["match"] and r["digest_match"] is True and not r["kv_recomputed"] for r in (first, again))


@pytest.mark.parametrize("name", cells(list(VLLM_CONNECTORS), set()))
def test_vllm_connectors_free_what_aborted_requests_held_and_reuse_it_intact(results_dir, name):
    """scenario=aborts against vLLM's connectors: half of the requests abandoned at a random point
    of their first 60 ms on the engine abandoned (the decode request goes once the prefill answered),
    while the KV is computed, in flight or loading; no KV block stays held on
    either engine, and every other request, on blocks the aborted ones held, matches with its
    digests (this project's strategies: tests/test_scenarios_cpu.py)."""
    run = run_harness(results_dir / f"e2e-aborts-{name}", "scenario=aborts", *VLLM_CONNECTORS[name])
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["requests"] == 16 and s["aborted"] >= 1
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0} and s["digest_failures"] == 0
    kept = [r for r in run.jsonl("requests.jsonl") if not r["aborted"]]
    assert kept and all(r["match"] and r["digest_match"] is True for r in kept)


# after one receive (make test-full), and after layer-by-layer loads: make test's, on the engines of
# the layerwise run before it (the negative control travels with the requests: the same engines), and
# after NIXL or Mooncake loaded it, by the observer beside vLLM's connector (on the engines of its run)
@pytest.fixture(scope="module", params=cells(["fused", "layerwise", "vllm_nixl", "vllm_mooncake"],
                                             {"layerwise", "vllm_nixl"}))
def corrupted_run(request, results_dir, tmp_path_factory):
    strategy = VLLM_CONNECTORS.get(request.param, (f"strategy={request.param}",))
    return harness_on_edge_prompts(results_dir, tmp_path_factory, f"corrupt-{request.param}", *strategy,
                                   "check.corrupt=true")


def test_negative_control_corruption_is_caught(corrupted_run):
    """KV damaged on purpose after the strategy's own receive must show as digest failures and
    output mismatches (vLLM's NIXL connector: damaged by the observer once NIXL loaded it)."""
    assert corrupted_run.code == 1
    s = corrupted_run.summary
    assert s["status"] == "mismatch"
    rows = corrupted_run.jsonl("requests.jsonl")
    corrupted = [r for r in rows if r["blocks"] > r["skip_blocks"]]  # received at least one block
    assert corrupted and all(r["digest_match"] is False for r in corrupted)
    assert s["digest_failures"] >= len(corrupted)
    assert s["mismatches"] >= len(corrupted) // 2, "corrupting a block should change most outputs"


def test_kv_that_never_arrives_fails_the_request_within_the_transfer_timeout(results_dir):
    run = run_harness(results_dir / "e2e-never_sends", "strategy=custom", "strategy.name=never_sends",
                      "strategy.module=tests.never_sends_strategy", "strategy.connector=NeverSends",
                      "workload=smoke", "sampling.max_tokens=4", "run.transfer_timeout_s=1",
                      "run.warmup_requests=0")  # a warm-up would time out as well: 1 s a request
    assert run.code == 1, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "transfer_failed" and s["transfer_errors"] == s["requests"] == 4
    assert "no KV arrived for transfer" in s["error"] and "within 1 s" in run.stderr
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}  # the parked requests' blocks were freed
    assert not any(any(h.values()) for h in s["transfer_held"].values())  # each timed-out transfer let go
    assert s["timings"]["disagg_s"] < 1 * 4 + 10  # each waited about the timeout, not run.request_timeout_s
    rows = run.jsonl("requests.jsonl")
    assert all("within 1 s" in r["error"] for r in rows)


def test_a_decode_engine_that_recomputes_the_prompt_fails_the_run(results_dir):
    """The transfer happens, the outputs match (the engine computed them itself), and with
    digests off nothing else would notice: the compute records do."""
    run = run_harness(results_dir / "e2e-recomputes", "strategy=custom", "strategy.name=ignores_the_kv",
                      "strategy.module=tests.recomputing_strategy", "strategy.connector=IgnoresTheKV",
                      "workload=smoke", "sampling.max_tokens=4", "check.digests=false")
    assert run.code == 1, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "kv_recomputed" and s["match_rate"] == 1.0
    assert s["kv_recomputed"] == s["requests"] == 4 and s["kv_recomputed_preempted"] == 0
    assert "recomputed their prompt" in run.stderr
    rows = run.jsonl("requests.jsonl")
    assert all(r["decode_computed_tokens"] == r["prompt_len"] and r["decode_loaded_tokens"] == 0 for r in rows)


def test_a_decode_engine_that_starts_from_tokens_nobody_sent_fails_the_run(results_dir):
    """The prefill side says it sent the KV of all but the prompt's last two tokens, the decode
    engine starts from all but the last one. Every block (copied whole) and every output
    matches; the token counts do not."""
    run = run_harness(results_dir / "e2e-miscounts", "strategy=custom", "strategy.name=sends_one_token_short",
                      "strategy.module=tests.miscounting_strategy", "strategy.connector=SendsOneTokenShort",
                      "workload=smoke", "sampling.max_tokens=4")
    assert run.code == 1, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "kv_miscounted" and s["match_rate"] == 1.0 and s["digest_failures"] == 0
    assert s["kv_miscounted"] == s["requests"] == 4 and s["kv_recomputed"] == 0
    assert "prompt tokens nobody sent" in run.stderr
    rows = run.jsonl("requests.jsonl")
    assert all((r["sent_tokens"], r["decode_cached_tokens"]) == (r["prompt_len"] - 2, r["prompt_len"] - 1)
               for r in rows)
    assert s["sent_tokens_sum"] == s["decode_loaded_tokens_sum"] - s["requests"]


@pytest.fixture(scope="module")
def crashed_run(results_dir):
    return run_harness(results_dir / "e2e-crash", "strategy=custom", "strategy.name=crash",
                       "strategy.module=tests.crashing_strategy", "strategy.connector=CrashOnSecondReceive",
                       "workload=smoke", "sampling.max_tokens=4", "run.request_timeout_s=60", "run.warmup_requests=1")


def test_engine_death_stops_the_run_and_keeps_records(crashed_run):
    assert crashed_run.code == 3
    assert "decode engine" in crashed_run.stderr and "died" in crashed_run.stderr
    assert crashed_run.summary["status"] == "engine_failed"
    assert len(crashed_run.jsonl("baseline.jsonl")) == 4
    assert len(crashed_run.jsonl("requests.jsonl")) == 1  # the request before the crash
    pids = crashed_run.summary["engine_pids"]
    for name in ("prefill", "decode"):  # stopped; the baseline, idle since its passes ended, may be kept
        assert not psutil.pid_exists(pids[name]) or psutil.Process(pids[name]).status() == psutil.STATUS_ZOMBIE
    assert pids["baseline"] in POOL.pids() or not psutil.pid_exists(pids["baseline"])
    assert crashed_run.summary["timings"]["shutdown_s"] < 30
