"""The GPU-memory check (harness/gpu_fit.py) on the GPU experiments' composed configs, with an
H100's and an H200's memory as torch reports them: no GPU needed."""

import pytest

from harness.gpu_fit import demand, unfit, weight_bytes
from harness.settings import settle
from tests.conftest import compose_config, refused_in_process
from tests.helpers.runs import assert_bad_input

H100, H200 = {0: 79.1}, {0: 139.8}  # torch.cuda.get_device_properties(0).total_memory / 2**30


def settings(*overrides: str):
    return settle(compose_config(*overrides), "cuda")


def test_the_8b_shape_weighs_what_its_bf16_parameters_do():
    # Llama-3-8B's layers (6.98 billion parameters) over this project's 3,502-token vocabulary, two bytes each
    assert weight_bytes("models/llama3-8b-shape", "bfloat16") / 1e9 == pytest.approx(14.02, rel=0.005)


def test_the_deepseek_shape_weighs_what_its_mla_and_dense_layers_do():
    # per layer: q 7168x1536 + 1536x128x192, latent 7168x576, its up-projection 512x128x256, output
    # 128x128x7168, MLP 3x7168x18432: 583.5 million; 12 layers and two 3,502 x 7168 embeddings
    assert weight_bytes("models/deepseek-v3-shape", "bfloat16") / 1e9 == pytest.approx(14.10, rel=0.005)


def test_three_8b_engines_at_once_fit_an_h200_and_not_an_h100():
    s = settings("experiment=gpu_ttft")
    assert unfit(s, H200) is None
    why = unfit(s, H100)
    assert why is not None and "\n" not in why
    assert "GPU 0" in why and "run.overlap_startup=false" in why and "engine.kv_cache_gib" in why


def test_without_overlapped_start_up_the_prefill_and_decode_engines_fit_an_h100():
    s = settings("experiment=gpu_ttft", "run.overlap_startup=false")
    assert [role for role, _ in demand(s)[0]] == ["prefill", "decode"]
    assert unfit(s, H100) is None


def test_engines_on_two_gpus_are_judged_per_gpu():
    s = settings("experiment=gpu_ttft", "device.decode_gpu=1")
    assert [role for role, _ in demand(s, 2)[0]] == ["baseline", "prefill"]
    assert [role for role, _ in demand(s, 2)[1]] == ["decode"]
    assert unfit(s, {0: 79.1, 1: 79.1}) is None


def test_the_staging_buffer_counts_on_the_decode_engines_gpu():
    small = dict(demand(settings("experiment=gpu_ttft", "transport.staging_mb=1024"))[0])
    large = dict(demand(settings("experiment=gpu_ttft"))[0])
    assert large["decode"] - small["decode"] == pytest.approx(3.0)
    assert large["prefill"] == small["prefill"]


def test_a_model_of_no_known_size_is_not_judged(tmp_path):
    s = settings("experiment=gpu_ttft", f"model.path={tmp_path}")
    assert demand(s) == {} and unfit(s, {0: 1.0}) is None


def test_the_harness_refuses_engines_that_do_not_fit_before_any_starts(tmp_path, monkeypatch):
    import harness.checks as checks

    monkeypatch.setattr(checks, "resolve_device", lambda cfg: "cuda")  # this machine's GPU: an H100's memory
    monkeypatch.setattr(checks, "gpu_memory_gib", lambda: H100)
    run = refused_in_process(tmp_path / "r", "experiment=gpu_ttft", "workload=smoke", device="cuda")
    assert_bad_input(run, "need 98.7 GiB at once", "run.overlap_startup=false")


def test_serving_instances_are_judged_all_at_once_each_on_its_gpu():
    one_gpu = settings("experiment=gpu_serve_1gpu")  # 1P1D and two colocated replicas on GPU 0
    assert [name for name, _ in demand(one_gpu)[0]] == ["baseline0", "baseline1", "prefill", "decode"]
    assert unfit(one_gpu, H100) is None
    big = settings("experiment=gpu_serve_1gpu", "model=llama3_8b_shape")
    assert "need 114.2 GiB at once" in unfit(big, H100) and unfit(big, H200) is None
    # two prefill instances: the decode instance holds a staging buffer for each
    two = dict(demand(settings("experiment=gpu_serve_1gpu", "serve.prefill_instances=2"))[0])
    assert two["decode"] - dict(demand(one_gpu)[0])["decode"] == pytest.approx(4.0)


def test_the_two_gpu_serving_experiment_fits_two_h100s_as_gpu_run_sh_lowers_its_kv():
    s = settings("experiment=gpu_serve")  # a colocated and a P/D instance on each of GPUs 0 and 1
    assert [name for name, _ in demand(s, 2)[1]] == ["baseline1", "decode"]
    assert "GPU 0 need 79.1 GiB" in unfit(s, {0: 79.1, 1: 79.1}) and unfit(s, {0: 139.8, 1: 139.8}) is None
    assert unfit(settings("experiment=gpu_serve", "engine.kv_cache_gib=16"), {0: 79.1, 1: 79.1}) is None
