"""On a GPU machine (`bash scripts/gpu_run.sh check` runs this module there): the strategies on
CUDA with the trained default model, outputs and digests against the colocated baseline, on one
GPU, across two GPUs where there are two, and with CUDA graphs on (how users deploy vLLM); and
issue 14's scenarios that touch the CUDA path (pressure, aborts, dropped and truncated KV); and
issue 15's tensor-parallel matrix with the trained Llama-3-8B KV geometry (models/llama3-8b-kv,
whose weights `bash scripts/gpu_run.sh kvmodel` makes there)."""

import json

import pytest

from harness.resolvers import built_in_strategies
from tests.conftest import ROOT, run_harness
from tests.helpers.runs import (
    EXTENDED,
    check_faults_caught,
    check_passed,
    edge_prompts,
    harness_on_edge_prompts,
    worker_records,
)
from transfer_strategies.tp import heads_of

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.engine,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# CUDA graphs on (the default on a GPU) and early decode submission (the default) unless a case says
CASES = {
    "fused": ["strategy=fused"],
    "per_request_blocks": ["strategy=per_request_blocks"],
    "layerwise": ["strategy=layerwise"],  # early: full graphs, its decode forward never waits per layer
    "layerwise-after_prefill": ["strategy=layerwise", "run.decode_submit=after_prefill"],  # piecewise: hooks run
    "full_cache": ["strategy=full_cache"],
    "fused-after_prefill": ["strategy=fused", "run.decode_submit=after_prefill"],
    "fused-eager": ["strategy=fused", "engine.enforce_eager=true"],
    "layerwise-eager": ["strategy=layerwise", "engine.enforce_eager=true"],
    "fused-two_gpus": ["strategy=fused", "device.decode_gpu=1"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_and_digests_match_the_baseline_on_cuda(case, results_dir):
    if "two_gpus" in case and torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    run = run_harness(results_dir / f"gpu-{case}", "experiment=gpu_check", *CASES[case], device="cuda")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["requests"] == 6 and s["match_rate"] == 1.0
    assert s["digest_checked"] == 6 and s["digest_failures"] == 0
    assert s["decode_submit"] == ("after_prefill" if "after_prefill" in case else "early")
    assert s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}
    piecewise = case == "layerwise-after_prefill"
    graphs = {"NONE"} if "eager" in case else ({"PIECEWISE"} if piecewise else {"FULL_AND_PIECEWISE"})
    assert {s["cudagraph_mode"][engine] for engine in ("prefill", "decode")} == graphs, s["cudagraph_mode"]
    assert abs(sum(s["overhead_parts_mean_ms"].values()) - s["overhead_mean_ms"]) < 1e-6


# no GPU MLA backend takes float32 (FlashAttention's and Triton's: fp16 and bf16): the trained weights' own bf16
@pytest.mark.parametrize("strategy", ["fused", "layerwise", "fused_int8"])
def test_the_trained_mla_model_moves_its_latent_on_cuda(strategy, results_dir):
    run = run_harness(results_dir / f"gpu-mla-{strategy}", "experiment=gpu_check", "model=tiny_mla",
                      "model.dtype=bfloat16", f"strategy={strategy}", device="cuda")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    # bf16: a near tie may tip either way (harness/records/compare.py); a lossy codec's outputs may differ
    assert s["status"] == "ok" and s["requests"] == 6
    assert strategy == "fused_int8" or s["mismatches"] == s["near_ties"]
    assert s["digest_checked"] == 6 and s["digest_failures"] == 0 and not s["kv_recomputed"]
    assert {s["cudagraph_mode"][engine] for engine in ("prefill", "decode")} == {"FULL_AND_PIECEWISE"}
    meta = json.loads((run.run_dir / "meta.json").read_text())
    assert meta["kv_geometry"]["kind"] == "latent" and meta["kv_geometry"]["bytes_per_token"] == 4 * 576 * 2
    for records in (worker_records(run, "send", 1)[0], worker_records(run, "receive", 1)[0]):
        assert {tuple(r["digests"]) for r in records} == {("all",)}  # per block: no heads to cut


@pytest.mark.parametrize("strategy", ["fused", "layerwise"])
def test_prompts_extending_one_that_ended_on_a_block_boundary_on_cuda(strategy, results_dir, tmp_path_factory):
    """The edge-case prompts (tests/test_e2e_cpu.py) with CUDA graphs and the prefix cache on, 4 in
    flight: two prompts extend a one-block prompt whose last slot the decode engine computed
    itself, in other bits than the prefill's on a GPU. Every strategy failed its digests here
    while every output matched: only the blocks a transfer wrote are judged now."""
    run = harness_on_edge_prompts(results_dir, tmp_path_factory, f"gpu-extended-{strategy}",
                                  f"strategy={strategy}", "workload.concurrency=4", device="cuda")
    assert run.code == 0, run.stderr[-3000:]
    s, rows = run.summary, {r["prompt_idx"]: r for r in run.jsonl("requests.jsonl")}
    assert s["status"] == "ok" and s["requests"] == len(edge_prompts()) and s["digest_failures"] == 0
    assert s["digest_checked"] == sum(r["blocks"] > r["skip_blocks"] for r in rows.values())
    assert all(rows[i]["skip_blocks"] >= 1 and rows[i]["digest_match"] for i in EXTENDED[1:])


@pytest.mark.parametrize("runner", ["offline", "serve"])
def test_multiturn_conversations_on_cuda(runner, results_dir):
    """workload=multiturn with CUDA graphs and the prefix cache on: every turn extends the previous
    one and its answer, half of them ending on a block boundary; the decode engine finds the earlier
    turns in its own cache, and every block a transfer wrote is judged by its digests."""
    serve = ["runner=serve", "serve.num_requests=4", "serve.request_rate=inf"] if runner == "serve" else []
    run = run_harness(results_dir / f"gpu-multiturn-{runner}", "strategy=fused", "workload=multiturn",
                      "workload.num_conversations=4", "workload.turns=4", "sampling.max_tokens=16",
                      "engine.max_model_len=1024", *serve, device="cuda")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["digest_failures"] == 0 and s["digest_checked"] > 0
    assert s["decode_prefix_hit_blocks"] > 0 and 0 < s["bytes_for_cached_blocks"] < s["total_bytes"]
    assert s["mismatches"] - s.get("near_ties", 0) <= (s.get("baseline_self_mismatches") or 0)


# Issue 14's scenarios that touch the CUDA path: pressure, and transfers dropped or truncated
SCENARIOS = {
    "decode_preemption-fused": ["scenario=decode_preemption", "strategy=fused"],
    "decode_preemption-layerwise": ["scenario=decode_preemption", "strategy=layerwise"],
    "prefill_reuse-fused": ["scenario=prefill_reuse", "strategy=fused"],
    "fault_drop-fused": ["scenario=fault_drop", "strategy=fused"],
    "fault_truncate-per_request_blocks": ["scenario=fault_truncate", "strategy=per_request_blocks"],
    "aborts-fused": ["scenario=aborts", "strategy=fused"],
}


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_scenarios_on_cuda(case, results_dir):
    run = run_harness(results_dir / f"gpu-scenario-{case}", "experiment=gpu_check", *SCENARIOS[case], device="cuda")
    if case.startswith("fault_"):
        check_faults_caught(run, case.split("-")[0].removeprefix("fault_"), requests=6)
        return
    if case.startswith("aborts"):
        assert run.code == 0, run.stderr[-3000:]
        s = run.summary
        assert s["status"] == "ok" and s["aborted"] >= 2 and s["kv_blocks_in_use"] == {"prefill": 0, "decode": 0}
        assert not any(any(h.values()) for h in s["transfer_held"].values())
        return
    s = check_passed(run, requests=6)
    if case.startswith("decode_preemption"):
        assert s["decode_preemptions"] >= 1 and s["timings"]["disagg_s"] < 60


# Issue 15: every strategy between prefill TP p and decode TP d with trained weights of Llama-3-8B's
# KV geometry (8 KV heads of 128, 32 layers): each decode worker's heads checked by digest. With
# two GPUs the prefill engine starts on GPU 0 and the decode engine on GPU 1 (a TP 2 engine takes
# both); 1 -> 1 runs on one GPU.
KV_MODEL = ROOT / "models" / "llama3-8b-kv"
KV_HEADS = json.loads((KV_MODEL / "config.json").read_text())["num_key_value_heads"]
TP_STRATEGIES = built_in_strategies(lossy=False)
TP_DEGREES = [(1, 1), (1, 2), (2, 1), (2, 2)]


@pytest.mark.skipif(not any(KV_MODEL.glob("*.safetensors")),
                    reason="models/llama3-8b-kv has no weights: bash scripts/gpu_run.sh kvmodel makes them")
# chunkwise's earlier messages do not know the count a decode worker joining heads needs: equal degrees only
@pytest.mark.parametrize("strategy,p,d", [(s, p, d) for p, d in TP_DEGREES for s in TP_STRATEGIES
                                          if s != "chunkwise" or p == d],
                         ids=lambda v: str(v))
def test_tp_with_the_trained_8b_kv_geometry(strategy, p, d, results_dir):
    gpus = torch.cuda.device_count()
    if max(p, d) > gpus:
        pytest.skip(f"TP {max(p, d)} needs {max(p, d)} GPUs")
    # full_cache moves its whole cache per request: one 512-token sequence's worth (128 MiB of KV)
    cache = ["engine.kv_cache_gib=0.125"] if strategy == "full_cache" else []
    run = run_harness(results_dir / f"gpu-tp-{strategy}-{p}to{d}", "experiment=gpu_check", "model=llama3_8b_kv",
                      f"strategy={strategy}", "engine.max_model_len=512", *cache,
                      f"engines.prefill={{tensor_parallel_size:{p}}}", f"engines.decode={{tensor_parallel_size:{d}}}",
                      f"device.decode_gpu={1 if gpus > 1 else 0}", device="cuda")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    # bf16: a near tie may tip either way (harness/records/compare.py); every KV head must arrive bit for bit
    assert s["status"] == "ok" and s["requests"] == 6 and s["mismatches"] == s["near_ties"]
    assert s["digest_checked"] == 6 and s["digest_failures"] == 0 and not s["kv_recomputed"]
    assert set(s["kv_blocks_in_use"].values()) == {0}
    for side, tp in (("send", p), ("receive", d)):
        for rank, records in enumerate(worker_records(run, side, tp)):
            assert len(records) == 6
            assert {tuple(r["digests"]) for r in records} == {tuple(str(h) for h in heads_of(rank, tp, KV_HEADS))}


@pytest.mark.skipif(not any(KV_MODEL.glob("*.safetensors")),
                    reason="models/llama3-8b-kv has no weights: bash scripts/gpu_run.sh kvmodel makes them")
def test_serving_the_trained_8b_kv_model_under_load_on_one_gpu(results_dir):
    """runner=serve with trained bf16 weights of the 8B KV geometry, every instance on GPU 0,
    CUDA graphs on: every request's KV checked by digest, and its output against the baseline's
    with near ties told apart (the decode instance computes the prompt's last token over loaded
    KV with another kernel than the colocated instance)."""
    run = run_harness(results_dir / "gpu-serve-llama3-8b-kv", "runner=serve", "model=llama3_8b_kv", "strategy=fused",
                      "workload=synthetic", "workload.prompt_len=300", "workload.num_prompts=16",
                      "engine.max_model_len=512", "engine.kv_cache_gib=2", "engine.gpu_memory_utilization=0.25",
                      "sampling.max_tokens=32", "serve.num_requests=32", "serve.request_rate=8", device="cuda")
    assert run.code == 0, run.stderr[-3000:]
    s = run.summary
    assert s["status"] == "ok" and s["ok"] == s["base_ok"] == 32 and s["digest_checked"] == 32
    assert s["digest_failures"] == 0 and s["transfer_errors"] == 0 and not s["kv_recomputed"]
    assert s["mismatches"] - s["near_ties"] <= s["baseline_self_mismatches"]
