"""Experiments (conf/experiment/) and the engine settings a strategy declares, without engines:
the configs each benchmark run gets, as `scripts/bench_strategies.py` builds its harness
commands and Hydra composes them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import harness.benchmark as bench
from harness import resolvers
from harness.resolvers import built_in_strategies
from tests.conftest import SLOW

ROOT = Path(__file__).resolve().parent.parent
resolvers.register()


PROMPTS = Path("/tmp/prompts.jsonl")


def composed(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


@pytest.mark.parametrize("experiment,full_cache_gib,others_gib", [
    (None, 0.0625, 1), ("cpu_bench", 0.0625, 1), ("gpu_bench", 2.5, 16)])
def test_full_cache_keeps_the_cache_it_declares_whatever_the_experiment_sets(experiment, full_cache_gib, others_gib):
    chosen = [f"experiment={experiment}"] if experiment else []
    assert composed([*chosen, "strategy=full_cache"]).engine.kv_cache_gib == full_cache_gib
    for strategy in built_in_strategies():
        if strategy != "full_cache":
            assert composed([*chosen, f"strategy={strategy}"]).engine.kv_cache_gib == others_gib


def test_the_command_line_still_overrides_a_strategys_engine_settings():
    assert composed(["experiment=gpu_bench", "strategy=full_cache", "engine.kv_cache_gib=3"]).engine.kv_cache_gib == 3
    assert composed(["strategy=full_cache", "engine.kv_cache_gib=2"]).engine.kv_cache_gib == 2


def test_the_gpu_benchmark_runs_every_strategy_as_gpu_run_sh_did():
    """What `gpu_run.sh bench` passed as flags, --set included, now comes from experiment=gpu_bench."""
    plan = bench.Plan.compose("gpu_bench", [])
    assert plan.device == "cuda" and plan.lengths == [512, 2048, 8192, 16384] and plan.per_length == 2
    assert sorted(plan.strategies) == sorted(built_in_strategies())  # the lossy ones too (their own YAMLs)
    assert {"full_cache", "fused", "layerwise", "per_request_blocks"} <= set(plan.strategies)
    for strategy in plan.strategies:
        cfg = composed(plan.harness_overrides(strategy, PROMPTS))
        assert cfg.strategy.name == strategy and cfg.model.name == "llama3-8b-shape" and cfg.device.type == "cuda"
        assert cfg.engine.gpu_memory_utilization == 0.28 and cfg.engine.max_model_len == 16384 + 64
        assert cfg.engine.kv_cache_gib == (2.5 if strategy == "full_cache" else 16)
        assert cfg.workload.path == str(PROMPTS) and cfg.sampling.max_tokens == 4


def test_two_gpus_put_decode_on_the_second():
    plan = bench.Plan.compose("gpu_bench", ["bench.strategies=[fused]"], two_gpus=True)
    cfg = composed(plan.harness_overrides("fused", PROMPTS))
    assert (cfg.device.prefill_gpu, cfg.device.decode_gpu, cfg.device.baseline_gpu) == (0, 1, 0)
    assert plan.strategies == ["fused"]


def test_the_cpu_benchmark_composes_what_the_old_flags_did():
    """python scripts/bench_strategies.py with no arguments: the same harness configs as before
    experiments (the committed CPU tables were taken with those), plus the bench section."""
    plan = bench.Plan.compose("cpu_bench", [])
    assert plan.device == "cpu" and plan.lengths == [32, 128, 256, 512, 1024, 2048] and plan.per_length == 5
    for strategy in plan.strategies:
        new = OmegaConf.to_container(composed(plan.harness_overrides(strategy, PROMPTS)), resolve=True)
        old = OmegaConf.to_container(composed([f"strategy={strategy}", "device=cpu", "workload=jsonl",
                                               f"workload.path={PROMPTS}", "engine.max_model_len=2112",
                                               "sampling.max_tokens=4"]), resolve=True)
        assert new.pop("bench") == {"lengths": plan.lengths, "per_length": 5, "engine_starts": 1,
                                    "strategies": plan.strategies, "decode_submit": []}
        assert new == old, strategy


def test_overrides_after_the_double_dash_reach_every_run():
    plan = bench.Plan.compose("cpu_bench", ["bench.lengths=[32,64]", "engine.block_size=64"])
    assert plan.lengths == [32, 64]
    assert composed(plan.harness_overrides("fused", PROMPTS)).engine.block_size == 64


@pytest.mark.parametrize("experiment,overrides,message", [
    ("cpu_bench", ["bench.lenghts=[32]"], "bench.lenghts"),
    ("nope", [], "experiment/nope"),
    ("gpu_check", [], "no bench section"),
    ("cpu_bench", ["bench.engine_starts=0"], "bench.engine_starts must be a whole number >= 1"),
])
def test_bad_benchmark_input_stops_before_any_run(experiment, overrides, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.Plan.compose(experiment, overrides)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_benchmark_runs_each_strategy_once_per_decode_submit_mode():
    plan = bench.Plan.compose("gpu_ttft", [])
    assert plan.runs == [(f"{s}-{m}", s, m) for s in ["fused", "per_request_blocks", "layerwise"]
                         for m in ["early", "after_prefill"]]
    job = composed(plan.harness_overrides("fused", PROMPTS, "after_prefill"))
    assert job.run.decode_submit == "after_prefill" and job.engine.enforce_eager is None  # CUDA graphs on a GPU
    assert bench.Plan.compose("gpu_ttft", ["bench.decode_submit=[early]"]).runs[0] == ("fused", "fused", "early")


def test_the_gpu_benchmarks_start_each_strategys_engines_three_times():
    """A figure's interval must cover what a rerun shows: between engine starts (docs/benchmarking.md)."""
    assert bench.Plan.compose("gpu_ttft", []).starts >= 3 and bench.Plan.compose("gpu_bench", []).starts >= 3
    assert bench.Plan.compose("cpu_bench", ["bench.engine_starts=2"]).starts == 2


@pytest.mark.skipif(__import__("torch").cuda.is_available(),
                    reason="proves what gpu_run.sh does where the benchmark cannot run")
@SLOW
def test_a_gpu_recipe_that_measured_nothing_exits_non_zero(tmp_path):
    """gpu_run.sh once wrote an empty table after its runs died and exited 0 (issue 47)."""
    env = dict(os.environ, RUNS=str(tmp_path), OUT=str(tmp_path), LENGTHS="64",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    script = str(ROOT / "scripts" / "gpu_run.sh")
    p = subprocess.run(["bash", script, "bench"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "torch sees no GPU" in p.stdout and "FAILED: exit code 2" in p.stderr
    p = subprocess.run(["bash", script, "bnech"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no recipe 'bnech'" in p.stderr


def test_a_benchmark_runs_round_by_round_into_one_directory(tmp_path):
    """--round K: a benchmark longer than one GPU call, each call one engine start of every strategy."""
    plan = bench.Plan("cpu_bench", [], [32], 1, ["fused", "layerwise"], "cpu", starts=3)
    ledger = bench.Ledger(tmp_path / "b", plan, False)
    assert ledger.refused([1]) is None
    ledger.open()
    ledger.run_dir("fused", 1).mkdir(parents=True)
    assert ledger.add_ceilings([1], 10.0, 12.0) == {"1": (10.0, 12.0)}
    assert "already holds fused's start 1" in ledger.refused([1])
    assert ledger.refused([2]) is None
    assert ledger.add_ceilings([2], 11.0, 9.0) == {"1": (10.0, 12.0), "2": (11.0, 9.0)}
    other = bench.Plan("cpu_bench", ["engine.block_size=64"], [32], 1, ["fused", "layerwise"], "cpu", starts=3)
    assert "holds another benchmark" in bench.Ledger(tmp_path / "b", other, False).refused([2])
    (tmp_path / "c" / "x").mkdir(parents=True)  # not a benchmark's directory
    assert "already holds results" in bench.Ledger(tmp_path / "c", plan, False).refused([1])


def test_a_round_the_benchmark_does_not_have_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_strategies.py", "--round", "2", "--out", str(tmp_path / "b")])
    assert bench.main() == 2  # cpu_bench starts the engines once
    assert "--round 2: bench.engine_starts is 1" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
