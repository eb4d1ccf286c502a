"""On a GPU machine (`bash scripts/gpu_run.sh check` runs this module there): the strategies on
CUDA with the trained default model, outputs and digests against the colocated baseline, on one
GPU, across two GPUs where there are two, and with CUDA graphs on (how users deploy vLLM)."""

import pytest

from tests.conftest import run_harness

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.engine,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = {
    "fused": ["strategy=fused"],
    "per_request_blocks": ["strategy=per_request_blocks"],
    "layerwise": ["strategy=layerwise"],
    "full_cache": ["strategy=full_cache"],
    "fused-cuda_graphs": ["strategy=fused", "engine.enforce_eager=false"],
    "layerwise-cuda_graphs": ["strategy=layerwise", "engine.enforce_eager=false"],  # piecewise graphs, its hooks run
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
