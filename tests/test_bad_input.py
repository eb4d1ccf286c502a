"""Bad input stops before any engine starts, with an error that says what to do."""

import time

from tests.conftest import run_harness, write_token_prompts


def _no_engine_started(run):
    return not list(run.run_dir.glob("*.log")) or all(p.name == "__main__.log" for p in run.run_dir.glob("*.log"))


def test_unknown_strategy_lists_choices(tmp_path):
    run = run_harness(tmp_path / "r", "strategy=nope")
    assert run.code != 0
    assert "fused" in run.stderr and "nope" in run.stderr


def test_unknown_model_and_workload_list_choices(tmp_path):
    run = run_harness(tmp_path / "m", "model=nope")
    assert run.code != 0 and "tiny_llama" in run.stderr
    run = run_harness(tmp_path / "w", "workload=nope")
    assert run.code != 0 and "synthetic" in run.stderr


def test_missing_model_path(tmp_path):
    t0 = time.monotonic()
    run = run_harness(tmp_path / "r", "model=hf", f"model.path={tmp_path}/no-such-model")
    assert run.code == 2
    assert "does not exist" in run.stderr and "model.path" in run.stderr
    assert time.monotonic() - t0 < 120 and _no_engine_started(run)


def test_prompt_longer_than_max_model_len(tmp_path):
    prompts = write_token_prompts(tmp_path / "p.jsonl", [[5] * 10, [7] * 200])
    run = run_harness(tmp_path / "r", "workload=jsonl", f"workload.path={prompts}", "engine.max_model_len=128")
    assert run.code == 2
    assert "prompt 1" in run.stderr and "engine.max_model_len" in run.stderr
    assert _no_engine_started(run)


def test_custom_strategy_module_missing(tmp_path):
    run = run_harness(tmp_path / "r", "strategy=custom", "strategy.module=no_such_pkg.mod", "strategy.connector=X")
    assert run.code == 2 and "no_such_pkg.mod" in run.stderr


def test_strategy_package_not_installed(tmp_path):
    run = run_harness(tmp_path / "r", "strategy=vllm_nixl", "strategy.requires=[no_such_package_xyz]")
    assert run.code == 2 and "no_such_package_xyz" in run.stderr and "make setup" in run.stderr
    assert _no_engine_started(run)
