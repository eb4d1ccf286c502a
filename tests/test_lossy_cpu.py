"""The lossy strategies (conf/strategy YAMLs with `lossy: true`, transfer_strategies/codecs.py) end
to end on CPU with real vLLM engines, on the edge-case prompts (tests/helpers/runs.py: under one
block, exactly one, prefix hits, several in flight): the transport exact (payload checksums and
the reconstruction's digests agree on both sides), the reconstruction's error recorded and within
the codec's bound, bytes down by the format's ratio, outputs compared with the baseline and the
cost reported (not required to match); and their faults caught as any strategy's.

make test runs the aggressive codec (fused_int4) and int8 from a prefill engine of TP 1 to a decode
engine of TP 2 (the payload cut by head); make test-full every lossy strategy, TP 2 -> 1 and 2 -> 2,
and the fault runs (a scale cut off in transit, a byte flipped without checksums)."""

import json

import pytest
import torch

from harness.offline.engine_pool import POOL
from harness.resolvers import built_in_strategies
from tests.conftest import FULL, ROOT, cells, run_harness
from tests.helpers.runs import check_faults_caught, edge_prompts, harness_on_edge_prompts, worker_records
from transfer_strategies.codecs import FORMATS
from transfer_strategies.tp import shares

pytestmark = pytest.mark.engine

LOSSY = built_in_strategies(lossy=True)
MODEL = json.loads((ROOT / "models" / "tiny-llama" / "config.json").read_text())
# one block of one layer of tiny-llama's KV on CPU: [KV heads, tokens, K and V side by side], float32
BLOCK_VALUES = MODEL["num_key_value_heads"] * 32 * 2 * MODEL["head_dim"]


@pytest.fixture(scope="module", params=cells(LOSSY, {"fused_int4"}))
def lossy_run(request, results_dir, tmp_path_factory):
    run = harness_on_edge_prompts(results_dir, tmp_path_factory, request.param, f"strategy={request.param}")
    run.case = request.param
    run.format = FORMATS[request.param.removeprefix("fused_")]
    return run


def test_the_transport_is_exact_and_the_error_within_the_codecs_bound(lossy_run):
    assert lossy_run.code == 0, lossy_run.stderr[-3000:]
    s = lossy_run.summary
    assert s["status"] == "ok" and s["requests"] == len(edge_prompts())
    rows = lossy_run.jsonl("requests.jsonl")
    # the decode engine's blocks are, bit for bit, what the sender reconstructs of its own payload
    assert [r["digest_match"] for r in rows] == [True if r["blocks"] > r["skip_blocks"] else None for r in rows]
    assert s["digest_failures"] == 0
    sends = {r["transfer_id"]: r for r in lossy_run.jsonl("prefill-transfers.jsonl")}
    receives = {r["transfer_id"]: r for r in lossy_run.jsonl("decode-transfers.jsonl")}
    judged = [t for t, r in receives.items() if r["blocks"] > r["skip_blocks"]]
    assert len(judged) >= len(rows) - 1
    assert all(sends[t]["payload_digest"] == receives[t]["payload_digest"] is not None for t in judged)
    bound = lossy_run.format.rel_error + torch.finfo(torch.float32).eps + 2.0**-20
    for r in rows:
        assert r["codec"].startswith(lossy_run.format.name + "/")
        assert r["codec_decode_ms"] is not None or r["blocks"] == r["skip_blocks"]
        if r["blocks"]:
            assert 0 < r["codec_max_rel"] <= bound and 0 < r["codec_mean_rel"] < 1
            assert r["codec_encode_ms"] > 0 and 0 < r["codec_mean_abs"] <= r["codec_max_abs"]
            fused_bytes = r["blocks"] * MODEL["num_hidden_layers"] * BLOCK_VALUES * 4
            # a float32 scale (as many bytes as one float32 value) per 32 values, or per block and head
            scales = 1 / 32 if lossy_run.case == "fused_int4" else 1 / (32 * MODEL["head_dim"])
            assert r["bytes"] == fused_bytes * (lossy_run.format.bits / 32 + scales)
    assert s["codec"].startswith(lossy_run.format.name) and 0 < s["codec_max_rel"] <= bound


def test_outputs_are_compared_and_their_cost_reported(lossy_run):
    s = lossy_run.summary
    rows = lossy_run.jsonl("requests.jsonl")
    assert all(isinstance(r["match"], bool) and len(r["token_ids"]) == 8 for r in rows)
    assert s["accuracy_drop"] == pytest.approx(s["baseline_self_match_rate"] - s["match_rate"])
    assert s["logprob_drift_max"] >= s["logprob_drift_mean"] >= 0 and s["logprob_drift_max"] > 0  # not the same KV
    assert (s["first_divergence_mean"] is None) == (s["mismatches"] == 0)
    assert f"lossy ({s['codec']})" in lossy_run.stdout
    assert "diagnosis" not in s  # outputs that differ are the codec's, not KV used wrongly


def test_the_decode_engine_used_the_kv_it_was_sent(lossy_run):
    rows = lossy_run.jsonl("requests.jsonl")
    assert all(r["kv_recomputed"] is False and r["decode_computed_tokens"] == 1 for r in rows)
    assert lossy_run.summary["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}
    assert lossy_run.summary["transfer_held"] == {"prefill": {"staging_regions": 0},
                                                  "decode": {"transfers": 0, "parked": 0}}


def test_the_task_score_and_an_accuracy_gate(results_dir):
    """Prompts cut from the model's training text (workload=corpus), scored against the text's own
    continuation; check.max_accuracy_drop=0 fails the run where the aggressive codec changed an
    output. On the kept fused_int4 engines (the gate is the harness's, not the connector's)."""
    run = run_harness(results_dir / "lossy-gate", "strategy=fused_int4", "workload=corpus",
                      "workload.num_prompts=8", "sampling.max_tokens=24", "check.max_accuracy_drop=0")
    s = run.summary
    assert s["digest_failures"] == 0 and s["codec"] and s["requests"] == 8
    assert 0 < s["base_task_score"] <= 1 and 0 <= s["task_score"] <= 1  # the model has memorised its text
    rows = run.jsonl("requests.jsonl")
    assert all(r["base_task_score"] is not None and r["task_score"] is not None for r in rows)
    assert "task score" in run.stdout
    # 4 of these 8 outputs differ from the baseline's (which matches itself: 2026-12-04, CPU)
    assert s["accuracy_drop"] > 0 and s["task_score"] < s["base_task_score"]
    assert run.code == 1 and s["status"] == "accuracy_drop", run.stderr[-3000:]
    assert "check.max_accuracy_drop=0" in run.stderr


@FULL
@pytest.mark.parametrize("strategy", LOSSY)
def test_a_payload_cut_short_in_transit_is_caught(results_dir, strategy):
    """Half the compressed payload (every scale with it) arrives: refused by its length, failed."""
    run = run_harness(results_dir / f"lossy-fault_truncate-{strategy}", "scenario=fault_truncate",
                      f"strategy={strategy}")
    check_faults_caught(run, "truncate", lossy=True)


@FULL
def test_a_byte_flipped_without_checksums_fails_the_digests(results_dir):
    """Without checksums the decode engine uses the damaged payload: the reconstruction differs
    from the sender's, and so do the payload's checksums; the run says the faults went unseen."""
    run = run_harness(results_dir / "lossy-fault_flip-no_checksums", "scenario=fault_flip", "check.checksums=false",
                      "strategy=fused_int8")
    assert run.code == 1, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "fault_missed" and s["faults_missed"] == 2
    faulted = [r for r in run.jsonl("requests.jsonl") if r["fault"]]
    assert all(r["digest_match"] is False and r["error"] is None for r in faulted)


@pytest.mark.parametrize("degrees", cells([(1, 2), (2, 1), (2, 2)], {(1, 2)}, ids=lambda c: f"{c[0]}to{c[1]}"))
def test_each_tensor_parallel_worker_compresses_its_own_heads(results_dir, tmp_path_factory, degrees):
    """Each prefill worker compresses its heads' KV and each decode worker reconstructs its own:
    2 -> 2 worker to worker; 1 -> 2 the payload cut by head, each part what that head alone
    compresses to; 2 -> 1 the parts joined. Per channel the payload checksums (of each part) and the
    digests agree, and the request rows merge the workers' errors."""
    p, d = degrees
    POOL.close()  # as the TP tests: what earlier runs kept is not this run's
    run = harness_on_edge_prompts(results_dir, tmp_path_factory, f"lossy-tp-{p}to{d}", "strategy=fused_int8",
                                  f"engines.prefill={{tensor_parallel_size:{p}}}",
                                  f"engines.decode={{tensor_parallel_size:{d}}}")
    POOL.close()
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["digest_failures"] == 0 and s["digest_checked"] == len(edge_prompts()) - 1
    sent, received = worker_records(run, "send", p), worker_records(run, "receive", d)
    for share in shares(p, d, MODEL["num_key_value_heads"]):
        got = {r["transfer_id"]: r["payload_digest"] for r in received[share.decode_rank]
               if r["blocks"] > r["skip_blocks"]}
        mine = {r["transfer_id"]: r["payload_digest"] for r in sent[share.prefill_rank] if r["transfer_id"] in got}
        assert got and mine.keys() == got.keys()
        if p == d:  # one payload each way
            assert mine == got
        else:  # a checksum per part: what this prefill worker sent that decode worker, as it arrived
            assert all(mine[t][str(share.decode_rank)] == got[t][str(share.prefill_rank)] for t in got)
    bound = FORMATS["int8"].rel_error + torch.finfo(torch.float32).eps + 2.0**-20
    assert all(0 < r["codec_max_rel"] <= bound for r in run.jsonl("requests.jsonl") if r["blocks"])


@FULL
def test_both_engines_storing_fp8_is_judged_as_lossy_against_a_full_precision_baseline(results_dir):
    """The other way users shrink KV (vLLM's kv_cache_dtype on the prefill and decode engines): the
    transport moves the FP8 blocks bit for bit (digests), the outputs are compared with the float32
    baseline's and the cost reported, not failed."""
    run = run_harness(results_dir / "lossy-kv_cache_dtype-fp8", "strategy=fused", "workload=corpus",
                      "workload.prompt_len=448", "workload.num_prompts=8", "sampling.max_tokens=32",
                      "engines.prefill={kv_cache_dtype:fp8}", "engines.decode={kv_cache_dtype:fp8}")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["kv_cache_dtype"] == "fp8" and s["codec"] is None
    assert s["digest_failures"] == 0 and s["digest_checked"] == 8
    assert s["logprob_drift_max"] > 1e-3 and "diagnosis" not in s  # not the baseline's KV, and said so
    assert "store KV as fp8" in run.stdout


@FULL
def test_the_serving_runner_judges_fp8_stored_kv_as_lossy_too(results_dir):
    """runner=serve with both instances storing FP8: the outputs' cost is reported, not failed (its
    summary's kv_cache_dtype, as the offline one's)."""
    run = run_harness(results_dir / "serve-kv_cache_dtype-fp8", "runner=serve", "strategy=fused", "workload=corpus",
                      "workload.prompt_len=448", "workload.num_prompts=8", "serve.num_requests=8",
                      "serve.request_rate=inf", "sampling.max_tokens=32",
                      "engines.prefill={kv_cache_dtype:fp8}", "engines.decode={kv_cache_dtype:fp8}")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["kv_cache_dtype"] == "fp8" and s["codec"] is None
    assert s["digest_failures"] == 0 and s["digest_checked"] == 8
    assert s["logprob_drift_max"] > 1e-3 and "store KV as fp8" in run.stdout
