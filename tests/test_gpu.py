"""On a GPU machine (`bash scripts/gpu_run.sh check` runs this module there): the strategies on
CUDA with the trained default model, outputs and digests against the colocated baseline, on one
GPU, across two GPUs where there are two, and with CUDA graphs on (how users deploy vLLM); and
issue 14's scenarios that touch the CUDA path (pressure, aborts, dropped and truncated KV)."""

import pytest

from tests.conftest import run_harness

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
    from tests.test_scenarios_cpu import check_faults_caught, check_passed

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
